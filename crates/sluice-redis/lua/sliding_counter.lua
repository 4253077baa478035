-- Sliding window counter: this window's count plus the previous one's, weighted by how much
-- of it still overlaps the sliding window. KEYS[1]: string "W A B len limit": the window index
-- W (windows of len µs on Unix time), the previous window's count A, this window's count B,
-- and the quota (window length, limit) they count under. A state of just "W A B" (written
-- before the quota was stored) counts as written under the current quota.
-- ARGV: cost, force, now (-1: Redis TIME), window (us), limit.
-- Returns {allowed, remaining, reset (us), 0} or, denied, {0, remaining, reset (us), base (us),
-- count, room}: see below.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local len = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])

local index = divmod(now, len)
local previous, current = 0, 0
local changed = false
local state = redis.call('GET', KEYS[1])
if state then
  local f = fields(state)
  local stored, slen, slimit = f[1], f[4] or len, f[5] or limit
  previous, current = f[2], f[3]
  -- Move to the window holding `now`, under the stored length.
  local at = divmod(now, slen)
  if at == stored + 1 then
    previous = current
    current = 0
  elseif at > stored + 1 then
    previous = 0
    current = 0
  elseif at < stored then
    at = stored
  end
  if slen ~= len or slimit ~= limit then
    -- A quota change, carried as the core does: the estimate at `now` under the stored quota,
    -- capped at the new limit, is this window's count (of the new length), nothing before it.
    local gone = now - at * slen
    if gone < 0 then gone = 0 end
    if gone > slen then gone = slen end
    local used = ceil_div(previous * (slen - gone), slen) + current
    previous = 0
    current = math.min(used, limit)
    changed = true
  else
    index = at
  end
end

local elapsed = now - index * len
if elapsed < 0 then elapsed = 0 end
if elapsed > len then elapsed = len end
local until_end = len - elapsed
local used = ceil_div(previous * until_end, len) + current
local reset = 0
if current > 0 then
  reset = until_end + len
elseif previous > 0 then
  reset = until_end
end

-- Stores the counts, under the current quota.
local function save()
  if previous == 0 and current == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local value = int(index) .. ' ' .. int(previous) .. ' ' .. int(current) .. ' ' .. ARGV[4] .. ' ' .. ARGV[5]
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(until_end + len))
end

-- A denial's retry time is left to the caller, exact in nanoseconds: it is `base` µs plus
-- the time the weighted count of `count` units takes to leave `room` units free
-- (window - room * window / count).
if used + cost > limit and not force then
  -- A converted state is written even on a denial, so no later check converts the old one again.
  if changed then save() end
  if current + cost <= limit then
    -- Later in this window, once the previous window's count has decayed enough.
    return {0, at_least_zero(limit - used), reset, -elapsed, previous, limit - current - cost}
  end
  -- In the next window, once this window's count (then the previous one) has decayed.
  return {0, at_least_zero(limit - used), reset, until_end, current, limit - cost}
end
if cost > 0 then
  current = current + cost
  reset = until_end + len
  save()
elseif changed then
  save()
end
return {1, at_least_zero(limit - used - cost), reset, 0}
