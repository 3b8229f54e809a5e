-- leaky_bucket: one string, the time the bucket is empty; an absent key is an empty bucket.
-- The level is (empty_at - now) / interval: virtual scheduling, named in water. Shaping holds
-- a request while the water ahead of it leaks, up to max_wait.
-- p: P (ticks per interval), R (ticks per us), burst, max wait in us (absent: meter mode).
-- Contract: core/src/algorithm/leaky_bucket.rs.

return schedule(key, now, cost, count_denied, commit, p[1], p[2], p[3], p[4], reach)
