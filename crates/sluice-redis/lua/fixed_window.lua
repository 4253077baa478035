-- Fixed window counter. KEYS[1]: string "W N", the window index W and the units N counted in it.
-- ARGV: cost, force, now (-1: Redis TIME), window (microseconds), limit.
-- Returns {allowed, remaining, reset (us), retry (us)}.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local window = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])

local index, into = divmod(now, window)
local until_end = window - into
local used = 0
local stored = redis.call('GET', KEYS[1])
if stored then
  local space = string.find(stored, ' ', 1, true)
  if tonumber(string.sub(stored, 1, space - 1)) == index then used = tonumber(string.sub(stored, space + 1)) end
end
local reset = until_end
if used == 0 then reset = 0 end

if used + cost > limit and not force then
  return {0, at_least_zero(limit - used), reset, until_end}
end
if cost == 0 then
  return {1, at_least_zero(limit - used), reset, 0}
end
used = used + cost
redis.call('SET', KEYS[1], int(index) .. ' ' .. int(used), 'PX', ttl_ms(until_end))
return {1, at_least_zero(limit - used), until_end, 0}
