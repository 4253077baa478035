-- A group of limits decided all or nothing in one call (a rule's several quotas): each limit's
-- script is `body` above, run as a function on its own keys and arguments. First each limit is
-- looked at (cost 0, writing only what a look writes); if every one has room for its cost,
-- each takes it (each take is then admitted: nothing else ran in between, at the same time);
-- otherwise each limit without room is checked with its cost (denied, it writes nothing and
-- says when to retry), and nothing is taken.
-- KEYS: each limit's keys, `per_keys` a limit, in order.
-- ARGV: n, per_keys, per_args, scaled (1: a reply's room is in units of p, the limit's 5th
-- argument), then each limit's arguments (cost, mode, now, ...). A `now` of -1 is Redis' clock,
-- read once for every limit.
-- Returns a flat list: for each limit, whether its cost was taken (1) or its reply is a look
-- or a denial (0), its reply's length, then the reply.
local n, per_keys, per_args = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local scaled = ARGV[4] == '1'
local now = int(now_micros(ARGV[4 + 3]))

local function run(i, cost)
  local keys, args = {}, {}
  for j = 1, per_keys do keys[j] = KEYS[(i - 1) * per_keys + j] end
  for j = 1, per_args do args[j] = ARGV[4 + (i - 1) * per_args + j] end
  args[1] = int(cost)
  args[3] = now
  return body(keys, args)
end

local function cost_of(i)
  return tonumber(ARGV[4 + (i - 1) * per_args + 1])
end

local function unit(i)
  if scaled then return tonumber(ARGV[4 + (i - 1) * per_args + 5]) end
  return 1
end

local replies, taken, fits = {}, {}, true
for i = 1, n do
  local look = run(i, 0)
  replies[i] = look
  taken[i] = 0
  if look[1] ~= 1 or look[2] < cost_of(i) * unit(i) then
    fits = false
    -- Denied: the take says when its cost fits, and writes nothing.
    replies[i] = run(i, cost_of(i))
  end
end
if fits then
  for i = 1, n do
    replies[i] = run(i, cost_of(i))
    -- Admitted, as its look said (a key given twice would not be: keys must be distinct).
    if replies[i][1] == 1 then taken[i] = 1 end
  end
end

local out = {}
for i = 1, n do
  out[#out + 1] = taken[i]
  out[#out + 1] = #replies[i]
  for _, v in ipairs(replies[i]) do out[#out + 1] = v end
end
return out
