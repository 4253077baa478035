-- Token bucket as GCRA. KEYS[1]: string "T F", the TAT in whole microseconds T plus F scaled
-- units (a fraction of a microsecond); just "T" when F is 0. Time is counted in scaled units of 1/k microsecond, in which
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
  local tw, tf = stored, 0
  local space = string.find(stored, ' ', 1, true)
  if space then
    tw = string.sub(stored, 1, space - 1)
    tf = tonumber(string.sub(stored, space + 1))
  end
  tw = tonumber(tw)
  if tw >= now then ahead = (tw - now) * k + tf end
end

local new_ahead = ahead + cost * p
if new_ahead > tau and not force then
  return {0, at_least_zero(tau - ahead), ahead, new_ahead - tau}
end
if cost > 0 then
  local whole, frac = divmod(new_ahead, k)
  local value = int(now + whole)
  if frac > 0 then value = value .. ' ' .. int(frac) end
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(whole + 1))
end
return {1, at_least_zero(tau - new_ahead), new_ahead, 0}
