-- sluice single: one check. Follows the prelude, schedule.lua and one algorithm's file wrapped
-- as the function `run` (server/src/scripts/mod.rs).
--
-- KEYS[1]   the check's key
-- ARGV[1]   the time (see clock() in prelude.lua)
-- ARGV[2]   cost; 0 only asks
-- ARGV[3]   "1" when a denied request consumes too
-- ARGV[4]   "1" to decide and consume, "0" only to ask (nothing is written)
-- ARGV[5..] the algorithm's parameters

local p = {}
for i = 5, #ARGV do
  p[i - 4] = tonumber(ARGV[i])
end
local answer = run(KEYS[1], clock(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4] == '1', p)
flush()
return reply({answer})
