-- sluice prelude: sluice-server prepends this to every limit script (server/src/scripts.rs),
-- so that each script below is one algorithm and nothing else.
--
-- KEYS[1]  the key's state
-- ARGV[1]  the time in microseconds (replay mode only), or "" to read Redis TIME
-- ARGV[2]  cost; 0 only asks
-- ARGV[3]  "1" when a denied request consumes too
-- ARGV[4..] the algorithm's parameters
--
-- Every script returns {allowed (0|1), limit, remaining, reset_ms, retry_after_ms, delay_ms},
-- with retry_after_ms = -1 for a request that can never pass. The arithmetic mirrors the
-- reference models in core/src/algorithm/, operation for operation, so that the two agree
-- to the last bit.

local AMOUNT_EPSILON = 1e-9
-- A replay's clock is virtual while expiry runs on Redis' own clock: a key must not vanish
-- (in real time) while the replay still needs it, so replayed keys live at least an hour.
local REPLAY_MIN_TTL_MS = 3600000
local TIME_EPSILON_US = 1.0
local NEVER = -1

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

-- Microseconds to whole milliseconds, rounded up: a client must not come back early.
local function ceil_ms(us)
  if us <= 0 then
    return 0
  end
  return math.ceil(us / 1000)
end

local function ttl_ms(us)
  if ARGV[1] ~= '' then
    return math.max(REPLAY_MIN_TTL_MS, ceil_ms(us))
  end
  return math.max(1, ceil_ms(us))
end

local function floor_units(x)
  local f = math.floor(x + AMOUNT_EPSILON)
  if f <= 0 then
    return 0
  end
  return f
end

local function flag(b)
  if b then
    return 1
  end
  return 0
end
