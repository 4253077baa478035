-- Sliding window log. KEYS[1]: sorted set of admissions, score = time (us), member =
-- "sequence:units". KEYS[2]: hash {n = units in the log, s = last sequence number, w = window
-- (us), l = limit: the quota the log counts under}. A hash without w and l (written before the
-- quota was stored) counts as written under the current quota.
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

local meta = redis.call('HMGET', KEYS[2], 'n', 'w', 'l')
local stored = tonumber(meta[1] or '0')
local stored_window, stored_limit = window, limit
if meta[2] then stored_window = tonumber(meta[2]) end
if meta[3] then stored_limit = tonumber(meta[3]) end
local changed = stored_window ~= window or stored_limit ~= limit
local total = stored

-- Writes the count and the quota it is under.
local function save_count()
  redis.call('HSET', KEYS[2], 'n', int(total), 'w', ARGV[4], 'l', ARGV[5])
end

-- An admission stops counting once a whole window has passed since it. At a quota change, once
-- the shorter of the two windows has (a unit that left the old window stays gone).
local span = math.min(stored_window, window)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - span)
if #expired > 0 then
  for _, member in ipairs(expired) do total = total - units(member) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - span)
end
if redis.call('ZCARD', KEYS[1]) == 0 then total = 0 end

if changed then
  -- Carried as the core does: over the new limit, the oldest units are forgotten first.
  local excess = total - limit
  if excess > 0 then
    -- Each entry holds at least one unit: the oldest `excess` entries are all that can go.
    local entries = redis.call('ZRANGE', KEYS[1], 0, excess - 1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      local member = entries[i]
      local n = units(member)
      redis.call('ZREM', KEYS[1], member)
      if n > excess then
        local seq = string.match(member, '^(%d+):')
        redis.call('ZADD', KEYS[1], entries[i + 1], seq .. ':' .. int(n - excess))
        total = total - excess
        break
      end
      total = total - n
      excess = excess - n
      if excess == 0 then break end
    end
  end
  -- Written even if this check is a denial or a peek, so no later check converts again; the
  -- keys are kept for the new window.
  save_count()
  stored = total
  redis.call('PEXPIRE', KEYS[1], ttl_ms(window))
  redis.call('PEXPIRE', KEYS[2], ttl_ms(window))
end

local function until_empty()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return at_least_zero(tonumber(last[2]) + window - now)
end

if total + cost > limit and not force then
  local needed = total + cost - limit
  local freed, retry = 0, 0
  -- Each entry holds at least one unit, so the oldest `needed` entries free enough: the work
  -- of a denial grows with its cost, not with the key's capacity.
  local entries = redis.call('ZRANGE', KEYS[1], 0, needed - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    freed = freed + units(entries[i])
    if freed >= needed then
      retry = at_least_zero(tonumber(entries[i + 1]) + window - now)
      break
    end
  end
  if total ~= stored then save_count() end
  return {0, at_least_zero(limit - total), until_empty(), retry}
end
if cost > 0 then
  local seq = redis.call('HINCRBY', KEYS[2], 's', 1)
  redis.call('ZADD', KEYS[1], now, seq .. ':' .. cost)
  total = total + cost
  redis.call('PEXPIRE', KEYS[1], ttl_ms(window))
  save_count()
  redis.call('PEXPIRE', KEYS[2], ttl_ms(window))
elseif total ~= stored then
  save_count()
end
return {1, at_least_zero(limit - total), until_empty(), 0}
