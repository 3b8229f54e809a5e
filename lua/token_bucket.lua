-- token_bucket: one string, the time the bucket is full again; an absent key is a full
-- bucket. Tokens are burst - (full_at - now) / interval: virtual scheduling, named in tokens.
-- p: P (ticks per interval), R (ticks per us), burst. Contract: core/src/algorithm/token_bucket.rs.

return schedule(key, now, cost, count_denied, commit, p[1], p[2], p[3], nil, reach)
