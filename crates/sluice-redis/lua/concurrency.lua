-- Concurrency limit with leases. KEYS[1]: sorted set of lease ids, score = expiry (us).
-- KEYS[2]: hash {n = permits held, s = last lease id, <id> = permits of that lease}.
-- A lease whose holder died expires and its permits come back.
-- ARGV[1] = op, ARGV[2] = now (-1: Redis TIME), then:
--   acquire: permits, capacity, lease (us) -> {1, id, available} or {0, 0, available}
--   release: id                            -> {1, 0, permits released}
--   renew:   id, lease (us)                -> {1 if the lease was still held, 0, 0}
local op = ARGV[1]
local now = now_micros(ARGV[2])

local held = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #expired > 0 then
  for _, id in ipairs(expired) do
    held = held - tonumber(redis.call('HGET', KEYS[2], id) or '0')
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HSET', KEYS[2], 'n', at_least_zero(held))
end
held = at_least_zero(held)

local function keep_for(micros)
  local want = ttl_ms(micros)
  for _, key in ipairs(KEYS) do
    if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
  end
end

if op == 'acquire' then
  local permits = tonumber(ARGV[3])
  local capacity = tonumber(ARGV[4])
  local lease = tonumber(ARGV[5])
  if held + permits > capacity then
    return {0, 0, capacity - held}
  end
  local id = redis.call('HINCRBY', KEYS[2], 's', 1)
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('HSET', KEYS[2], id, permits, 'n', held + permits)
  keep_for(lease)
  return {1, id, capacity - held - permits}
elseif op == 'release' then
  local id = ARGV[3]
  local permits = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  if permits > 0 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', KEYS[2], 'n', at_least_zero(held - permits))
  end
  return {1, 0, permits}
elseif op == 'renew' then
  local id = ARGV[3]
  local lease = tonumber(ARGV[4])
  if redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], 'XX', now + lease, id)
    keep_for(lease)
    return {1, 0, 0}
  end
  return {0, 0, 0}
end
return redis.error_reply('unknown operation ' .. tostring(op))
