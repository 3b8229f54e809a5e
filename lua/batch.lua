-- sluice batch: every check of one request in one call, in order, atomically. Follows the
-- algorithm functions (run_<algorithm>) that sluice-server composes before it.
--
-- KEYS[i]  check i's key
-- ARGV[1]  the number of checks
-- then per check: the algorithm's number (1-6, in ALGORITHMS order), "1" for a shadow check,
-- the number of arguments, and the check's own ARGV (as for a single script).
--
-- Once an enforced (non-shadow) check is denied, the checks after it are asked at cost 0: a
-- denied request consumes nothing more. Returns the six numbers of every check, in order.

local checks = tonumber(ARGV[1])
local at = 2
local denied = false
local out = {}
for i = 1, checks do
  local run = ALGORITHMS[tonumber(ARGV[at])]
  local shadow = ARGV[at + 1] == '1'
  local count = tonumber(ARGV[at + 2])
  local args = {}
  for j = 1, count do
    args[j] = ARGV[at + 2 + j]
  end
  at = at + 3 + count
  if denied then
    args[2] = '0'
  end
  local verdict = run({KEYS[i]}, args)
  for _, v in ipairs(verdict) do
    out[#out + 1] = v
  end
  if verdict[1] == 0 and not shadow then
    denied = true
  end
end
return out
