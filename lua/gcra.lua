-- gcra: one string, the theoretical arrival time. redis-cell's CL.THROTTLE with
-- max_burst = burst - 1, count = rate, period = per: GCRA is virtual scheduling itself.
-- p: P (ticks per interval), R (ticks per us), burst. Contract: core/src/algorithm/gcra.rs.

return schedule(key, now, cost, count_denied, commit, p[1], p[2], p[3], nil, reach)
