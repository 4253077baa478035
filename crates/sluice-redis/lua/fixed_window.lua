-- Fixed window counter. KEYS[1]: string "W N len limit": the window index W (windows of len µs
-- on Unix time), the units N counted in it, and the quota (window length, limit) it counts
-- under. A state of just "W N" (written before the quota was stored) counts as written under
-- the current quota.
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
local changed = false
local stored = redis.call('GET', KEYS[1])
if stored then
  local f = fields(stored)
  local len, lim = f[3] or window, f[4] or limit
  -- The units of the stored window, if it holds `now` under its own length.
  local stored_index = divmod(now, len)
  local counted = 0
  if f[1] == stored_index then counted = f[2] end
  if len ~= window or lim ~= limit then
    -- A quota change, carried as the core does: capped at the new limit, into the window of
    -- the new length that holds `now`.
    used = math.min(counted, limit)
    changed = true
  else
    used = counted
  end
end

-- Stores `n` units in this window, under the current quota.
local function save(n)
  if n == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local value = int(index) .. ' ' .. int(n) .. ' ' .. ARGV[4] .. ' ' .. ARGV[5]
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(until_end))
end

local reset = until_end
if used == 0 then reset = 0 end

if used + cost > limit and not force then
  -- A converted state is written even on a denial, so no later check converts the old one again.
  if changed then save(used) end
  return {0, at_least_zero(limit - used), reset, until_end}
end
if cost == 0 then
  if changed then save(used) end
  return {1, at_least_zero(limit - used), reset, 0}
end
used = used + cost
save(used)
return {1, at_least_zero(limit - used), until_end, 0}
