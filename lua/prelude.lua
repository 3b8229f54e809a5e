-- sluice prelude: constants and pure helpers shared by every limit script. sluice-server
-- composes each script as prelude + frame + one algorithm file, and the batch script as
-- prelude + each algorithm file wrapped in a frame + batch.lua (server/src/scripts.rs), so
-- that each algorithm file is that algorithm and nothing else.
--
-- Every algorithm returns {allowed (0|1), limit, remaining, reset_ms, retry_after_ms,
-- delay_ms}, with retry_after_ms = -1 for a request that can never pass. The arithmetic
-- mirrors the reference models in core/src/algorithm/, operation for operation, so that the
-- two agree to the last bit.

local AMOUNT_EPSILON = 1e-9
-- A replay's clock is virtual while expiry runs on Redis' own clock: a key must not vanish
-- (in real time) while the replay still needs it, so replayed keys live at least an hour.
local REPLAY_MIN_TTL_MS = 3600000
local TIME_EPSILON_US = 1.0
local NEVER = -1

-- Microseconds to whole milliseconds, rounded up: a client must not come back early.
local function ceil_ms(us)
  if us <= 0 then
    return 0
  end
  return math.ceil(us / 1000)
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
