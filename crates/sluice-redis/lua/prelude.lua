-- Shared helpers, prepended to every script. Redis Lua numbers are doubles: every value
-- computed here stays an integer below 2^53 (the Rust side refuses quotas that could not),
-- so all arithmetic is exact.

-- Floor division and remainder of integers, corrected for the rounding of a / b.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
    r = r + b
  elseif r >= b then
    q = q + 1
    r = r - b
  end
  return q, r
end

local function ceil_div(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

local function at_least_zero(x)
  if x < 0 then return 0 end
  return x
end

-- Microseconds from Redis' own clock, so every host reads the same time. A non-negative
-- argument replaces it (used only by tests that replay a fixed sequence of instants).
local function now_micros(arg)
  local given = tonumber(arg)
  if given >= 0 then return given end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integer as decimal digits (tostring would switch to an exponent above 10^14).
local function int(x)
  return string.format('%.0f', x)
end

-- Expiry in milliseconds for state that matters for `micros` more: rounded up, plus a margin.
local function ttl_ms(micros)
  return math.floor(micros / 1000) + 2
end

-- The space-separated numbers of a stored state.
local function fields(s)
  local t = {}
  for field in string.gmatch(s, '%S+') do t[#t + 1] = tonumber(field) end
  return t
end
