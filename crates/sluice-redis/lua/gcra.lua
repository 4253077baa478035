-- Token bucket as GCRA. KEYS[1]: hash {t = TAT in whole microseconds, f = the fraction of a
-- microsecond in scaled units}. Time is counted in scaled units of 1/k microsecond, in which
-- one unit of cost is exactly p long and the whole capacity tau = capacity * p long.
-- ARGV: cost, force (1: consume even when over, for hybrid sync), now (-1: Redis TIME), k, p, tau.
-- Returns {allowed, room, ahead, over}: room and ahead in scaled units (room / p is what remains,
-- ahead / k microseconds until full), over = scaled time until the cost fits when denied.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local k = tonumber(ARGV[4])
local p = tonumber(ARGV[5])
local tau = tonumber(ARGV[6])

local ahead = 0
local s = redis.call('HMGET', KEYS[1], 't', 'f')
if s[1] then
  local tw = tonumber(s[1])
  local tf = tonumber(s[2]) or 0
  if tw >= now then ahead = (tw - now) * k + tf end
end

local new_ahead = ahead + cost * p
if new_ahead > tau and not force then
  return {0, at_least_zero(tau - ahead), ahead, new_ahead - tau}
end
if cost > 0 then
  local whole, frac = divmod(new_ahead, k)
  redis.call('HSET', KEYS[1], 't', now + whole, 'f', frac)
  redis.call('PEXPIRE', KEYS[1], ttl_ms(whole + 1))
end
return {1, at_least_zero(tau - new_ahead), new_ahead, 0}
