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
--   [16] note            operator completions' note (absent in older records: read as '')
--   [17] operator        the operator principal's name (idem)
--
-- The lease index of one agent, og:{<agent digest>}:leases, is a sorted set: member = the encoded
-- action key, score = lease_expires_at, one member per authorized record (live or expired). Every
-- script that writes a record receives it as KEYS[2] and the member as ARGV[1], and `save` keeps
-- it in step; both keys share the agent's hash tag, so Cluster runs the script on one slot.
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

-- Keeps the agent's lease index in step with a record just written: indexed while authorized,
-- removed otherwise. The index outlives its longest-lived record, and no longer.
local function index(rec)
  if rec[1] == 1 then
    redis.call('ZADD', KEYS[2], rec[10], ARGV[1])
    if redis.call('PTTL', KEYS[2]) < rec[7] - NOW then
      redis.call('PEXPIRE', KEYS[2], rec[7] - NOW)
    end
  else
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
end

local function save(key, rec)
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', rec[7] - NOW)
  index(rec)
end

-- An operator completion (ledger::operator_completion): the live token, if any, joins the older
-- ones so that its holder hears COMPLETED_BY_OTHER.
local function operator_complete(rec, receipt, note, operator)
  if rec[1] == 1 then
    table.insert(rec[11], { rec[8], rec[2] })
  end
  rec[1], rec[7], rec[8] = 2, NOW + rec[5], ''
  rec[12], rec[13], rec[14], rec[15], rec[16], rec[17] = receipt, NOW, rec[2], 2, note, operator
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
  return { NOW, tag, recorded, double, rec[12], rec[13], rec[14], rec[8], rec[15],
           rec[16] or '', rec[17] or '' }
end
