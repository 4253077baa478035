-- Sliding window log. KEYS[1]: sorted set of admissions, score = time (us), member =
-- "sequence:units". KEYS[2]: hash {n = units in the log, s = last sequence number}.
-- ARGV: cost, force, now (-1: Redis TIME), window (us), limit.
-- Returns {allowed, remaining, reset (us), retry (us)}.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local window = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])

local function units(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

local stored = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
local total = stored
-- An admission stops counting once a whole window has passed since it.
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
if #expired > 0 then
  for _, member in ipairs(expired) do total = total - units(member) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
end
if redis.call('ZCARD', KEYS[1]) == 0 then total = 0 end

local function until_empty()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return at_least_zero(tonumber(last[2]) + window - now)
end

if total + cost > limit and not force then
  local needed = total + cost - limit
  local freed, retry = 0, 0
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    freed = freed + units(entries[i])
    if freed >= needed then
      retry = at_least_zero(tonumber(entries[i + 1]) + window - now)
      break
    end
  end
  if total ~= stored then redis.call('HSET', KEYS[2], 'n', total) end
  return {0, at_least_zero(limit - total), until_empty(), retry}
end
if cost > 0 then
  local seq = redis.call('HINCRBY', KEYS[2], 's', 1)
  redis.call('ZADD', KEYS[1], now, seq .. ':' .. cost)
  total = total + cost
  redis.call('PEXPIRE', KEYS[1], ttl_ms(window))
  redis.call('HSET', KEYS[2], 'n', total)
  redis.call('PEXPIRE', KEYS[2], ttl_ms(window))
elseif total ~= stored then
  redis.call('HSET', KEYS[2], 'n', total)
end
return {1, at_least_zero(limit - total), until_empty(), 0}
