-- Sliding window counter: this window's count plus the previous one's, weighted by how much
-- of it still overlaps the sliding window. KEYS[1]: string "W A B", the window
-- index W, the previous window's count A and this window's count B. ARGV: cost, force, now (-1: Redis TIME), window (us), limit.
-- Returns {allowed, remaining, reset (us), 0} or, denied, {0, remaining, reset (us), base (us),
-- count, room}: see below.
local cost = tonumber(ARGV[1])
local force = ARGV[2] == '1'
local now = now_micros(ARGV[3])
local len = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])

local index = divmod(now, len)
local previous, current = 0, 0
local state = redis.call('GET', KEYS[1])
if state then
  local w, a, b = string.match(state, '^(%S+) (%S+) (%S+)$')
  local stored = tonumber(w)
  previous = tonumber(a)
  current = tonumber(b)
  if index == stored + 1 then
    previous = current
    current = 0
  elseif index > stored + 1 then
    previous = 0
    current = 0
  elseif index < stored then
    index = stored
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

-- A denial's retry time is left to the caller, exact in nanoseconds: it is `base` µs plus
-- the time the weighted count of `count` units takes to leave `room` units free
-- (window - room * window / count).
if used + cost > limit and not force then
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
  local value = int(index) .. ' ' .. int(previous) .. ' ' .. int(current)
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(until_end + len))
end
return {1, at_least_zero(limit - used - cost), reset, 0}
