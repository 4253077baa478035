-- Token bucket as GCRA. KEYS[1]: string "T F k p tau": the TAT in whole microseconds T plus F
-- scaled units (a fraction of a microsecond), and the quota it was written under. Time is
-- counted in scaled units of 1/k microsecond, in which one unit of cost is exactly p long and
-- the whole capacity tau = capacity * p long. A state of just "T" or "T F" (written before the
-- quota was stored) counts as written under the current quota.
-- ARGV: cost, mode (0: a check; 1: consume even when over, for hybrid sync; 2: a charge, down to
-- `deepest`), now (-1: Redis TIME), k, p, tau[, deepest].
-- Returns {allowed, room, ahead, over}: room and ahead in scaled units (room / p is what remains,
-- ahead / k microseconds until full), over = scaled time until the cost fits when denied. A
-- charge returns the same for a peek after it, and then the scaled length it charged.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local k = tonumber(ARGV[4])
local p = tonumber(ARGV[5])
local tau = tonumber(ARGV[6])

local ahead = 0
local changed = false
local stored = redis.call('GET', KEYS[1])
if stored then
  local f = fields(stored)
  local tw, tf = f[1], f[2] or 0
  local sk, sp, stau = f[3] or k, f[4] or p, f[5] or tau
  if tw >= now then ahead = (tw - now) * sk + tf end
  -- A quota change, carried as the core does (Algorithm::carry_over).
  if sk ~= k or sp ~= p then
    -- Another rate: the consumption in whole units, rounded up (exact here in µs as in the
    -- core in ns), capped at the new capacity before the product, so it stays below 2^50.
    local capacity = (divmod(tau, p))
    ahead = math.min(ceil_div(ahead, sp), capacity) * p
    changed = true
  elseif stau ~= tau then
    -- The same rate: the scaled time exactly, capped at the new capacity.
    ahead = math.min(ahead, tau)
    changed = true
  end
end

-- Stores the bucket `a` scaled units from full, under the current quota.
local function save(a)
  if a == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local whole, frac = divmod(a, k)
  local value = int(now + whole) .. ' ' .. int(frac) .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6]
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(whole + 1))
end

if ARGV[2] == '2' then
  -- A cost known after the fact: taken whatever is left, at most to `deepest` ahead (the
  -- quota's debt below empty); never moved back by it. A huge cost rounds as a double, and
  -- is then capped at `deepest`, which is exact.
  local deepest = tonumber(ARGV[7])
  local target = math.min(ahead + cost * p, math.max(deepest, ahead))
  if target > ahead or changed then save(target) end
  local allowed = 1
  if target > tau then allowed = 0 end
  return {allowed, at_least_zero(tau - target), target, at_least_zero(target - tau), target - ahead}
end

local new_ahead = ahead + cost * p
if new_ahead > tau and not force then
  -- A converted state is written even on a denial, so no later check converts the old one again.
  if changed then save(ahead) end
  return {0, at_least_zero(tau - ahead), ahead, new_ahead - tau}
end
if cost > 0 or changed then save(new_ahead) end
return {1, at_least_zero(tau - new_ahead), new_ahead, 0}
