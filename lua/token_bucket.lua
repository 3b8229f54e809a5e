-- token_bucket: a hash {tokens, ts}; an absent key is a full bucket.
-- ARGV[4] rate, ARGV[5] per (us), ARGV[6] burst. Contract: core/src/algorithm/token_bucket.rs.

local rate = tonumber(ARGV[4])
local per = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local now = now_us()

local tokens = burst
local ts = now
local stored = redis.call('HMGET', key, 'tokens', 'ts')
if stored[1] then
  tokens = tonumber(stored[1])
  ts = tonumber(stored[2])
end
local elapsed = math.max(0, now - ts)
tokens = math.min(burst, tokens + elapsed * rate / per)
ts = math.max(ts, now)

local function until_full(t)
  return (burst - t) * per / rate
end

if cost > burst then
  return {0, burst, floor_units(tokens), ceil_ms(until_full(tokens)), NEVER, 0}
end

local allowed = tokens + AMOUNT_EPSILON >= cost
local new_tokens = tokens
if allowed then
  new_tokens = tokens - cost
elseif count_denied then
  new_tokens = math.max(-burst, tokens - cost)
end

local retry_us = 0
if not allowed then
  retry_us = (cost - new_tokens) * per / rate
end
if cost > 0 and (allowed or count_denied) then
  redis.call('HSET', key, 'tokens', new_tokens, 'ts', ts)
  redis.call('PEXPIRE', key, ttl_ms(until_full(new_tokens)))
end
return {flag(allowed), burst, floor_units(new_tokens), ceil_ms(until_full(new_tokens)), ceil_ms(retry_us), 0}
