-- Token bucket as GCRA. KEYS[1]: string "T F", the TAT in whole microseconds T plus F scaled
-- units (a fraction of a microsecond). Time is counted in scaled units of 1/k microsecond, in which
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
local stored = redis.call('GET', KEYS[1])
if stored then
  local tw, tf = string.match(stored, '^(%S+) (%S+)$')
  tw = tonumber(tw)
  if tw and tw >= now then ahead = (tw - now) * k + tonumber(tf) end
end

local new_ahead = ahead + cost * p
if new_ahead > tau and not force then
  return {0, at_least_zero(tau - ahead), ahead, new_ahead - tau}
end
if cost > 0 then
  local whole, frac = divmod(new_ahead, k)
  redis.call('SET', KEYS[1], int(now + whole) .. ' ' .. int(frac), 'PX', ttl_ms(whole + 1))
end
return {1, at_least_zero(tau - new_ahead), new_ahead, 0}
