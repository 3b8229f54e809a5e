-- sluice batch: every check of one request in one call, atomically, all or nothing. Follows
-- the prelude, schedule.lua and every algorithm's file wrapped as ALGORITHMS[n]
-- (server/src/scripts/mod.rs). Contract: core/src/algorithm/all_or_nothing.rs.
--
-- KEYS[i]  check i's key (all distinct)
-- ARGV[1]  the time (see clock() in prelude.lua)
-- ARGV[2]  the number of checks
-- then per check: the algorithm's number (1-6, in ALGORITHMS order), cost, "1" when a denial
-- consumes too, "1" for a shadow check, the number of parameters, the parameters.
--
-- A request that an enforced (non-shadow) check denies consumes nothing from any rule: the
-- checks that deny are decided as denials (counted only with count_denied), the others are
-- asked at cost 0. Otherwise every check consumes. Answers the six numbers of every check
-- (reply() in prelude.lua).

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local checks = {}
local at = 3
for i = 1, n do
  local count = tonumber(ARGV[at + 4])
  local p = read_params(ARGV, at + 4, count)
  checks[i] = {
    run = ALGORITHMS[tonumber(ARGV[at])],
    cost = tonumber(ARGV[at + 1]),
    count_denied = ARGV[at + 2] == '1',
    shadow = ARGV[at + 3] == '1',
    p = p,
  }
  at = at + 5 + count
end

local function decide(i, cost, commit)
  local c = checks[i]
  return c.run(KEYS[i], now, cost, c.count_denied, commit, c.p)
end

-- Ask every enforced check but the last whether it admits, consuming nothing. The last one
-- needs no asking: if the others admit, it may consume at once, and its own answer settles
-- the request.
local last = nil
for i = n, 1, -1 do
  if not checks[i].shadow then
    last = i
    break
  end
end
local asked = {}
local blocked = false
for i = 1, n do
  if i ~= last and not checks[i].shadow then
    asked[i] = decide(i, checks[i].cost, false)
    if asked[i][1] == 0 then
      blocked = true
      break
    end
  end
end
local out = {}
if last and not blocked then
  out[last] = decide(last, checks[last].cost, true)
  blocked = out[last][1] == 0
end
for i = 1, n do
  if not out[i] then
    if not blocked then
      out[i] = decide(i, checks[i].cost, true)
    else
      local answer = asked[i] or decide(i, checks[i].cost, false)
      if answer[1] == 1 then
        out[i] = decide(i, 0, true)
      else
        out[i] = decide(i, checks[i].cost, true)
      end
    end
  end
end

flush()
return reply(out)
