-- Shared by every oncegate script (prepended to each one when it is loaded).
--
-- The record of one action is one string key holding a MessagePack array:
--   [1] state            1 authorized, 2 completed, 3 released
--   [2] fencing          the latest grant's number; kept across release
--   [3] fingerprint      the request hash every later request must match
--   [4] digests          per-field digests (only for idempotency-keyed actions), opaque here
--   [5] retention_ms     how long a completed record is kept
--   [6] sliding          1 when a replay pushes retention forward
--   [7] expires_at       store expiry in ms (mirrors the key's PX)
--   [8] token            live token (authorized), released token (released), completing token
--   [9] holder           the holder named at grant time
--   [10] lease_expires_at
--   [11] older           { {token, fencing}, ... } earlier grants neither released nor completed
--   [12] receipt
--   [13] completed_at
--   [14] completed_fencing
--   [15] source          1 worker, 2 operator
-- Every reply starts with { now_ms, tag, ... }; src/store/redis.rs decodes them in one place.
-- Time is Redis's own (TIME), so every gate replica agrees on when a lease ends.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local NOW = now_ms()

-- The live record, or nil. A record past its own expiry is absent even if the key lingers.
local function load(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local rec = cmsgpack.unpack(raw)
  if rec[7] <= NOW then
    return nil
  end
  return rec
end

local function save(key, rec)
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', rec[7] - NOW)
end

local function find_older(rec, token)
  for i, g in ipairs(rec[11]) do
    if g[1] == token then
      return i, g[2]
    end
  end
  return nil, nil
end

local function completion_reply(tag, rec, recorded, double)
  return { NOW, tag, recorded, double, rec[12], rec[13], rec[14], rec[8], rec[15] }
end
