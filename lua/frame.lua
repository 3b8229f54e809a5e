-- sluice frame: one check's arguments. In a single script it reads the script's own KEYS and
-- ARGV; in the batch script it is the top of a function whose parameters are named KEYS and
-- ARGV, one check's slice of them.
--
-- KEYS[1]  the key's state
-- ARGV[1]  the time in microseconds (replay mode only), or "" to read Redis TIME
-- ARGV[2]  cost; 0 only asks
-- ARGV[3]  "1" when a denied request consumes too
-- ARGV[4..] the algorithm's parameters

local key = KEYS[1]
local cost = tonumber(ARGV[2])
local count_denied = ARGV[3] == '1'

local function now_us()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function ttl_ms(us)
  if ARGV[1] ~= '' then
    return math.max(REPLAY_MIN_TTL_MS, ceil_ms(us))
  end
  return math.max(1, ceil_ms(us))
end
