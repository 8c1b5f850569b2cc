-- Shared by the ledger's scripts: the first part of the library (library.rs) they are registered in.
-- Runs once, when the library is loaded; NOW (Redis TIME in ms), KEYS and ARGV are the library's
-- variables, set at the start of every call.
--
-- The record of one action is one string key holding a MessagePack array; its slots are named
-- here, once, and every script reads and writes them by these names (ledger::Record mirrors them).
local STATE = 1             -- AUTHORIZED, COMPLETED or RELEASED
local FENCING = 2           -- the latest grant's number; kept across release
local FINGERPRINT = 3       -- the request hash every later request must match
local DIGESTS = 4           -- per-field digests (idempotency-keyed actions only), opaque here
local RETENTION = 5         -- how long a completed record is kept, in ms
local SLIDING = 6           -- 1 when a replay pushes retention forward
local EXPIRES_AT = 7        -- store expiry in ms (the key's PXAT); 0: kept until settled
local TOKEN = 8             -- live token (authorized), released token, completing token
local HOLDER = 9            -- the holder named at grant time
local LEASE_END = 10        -- lease_expires_at; for a released record, when it was released
local OLDER = 11            -- { {token, fencing}, ... } earlier grants neither released nor completed
local RECEIPT = 12
local COMPLETED_AT = 13
local COMPLETED_FENCING = 14
local SOURCE = 15           -- BY_WORKER or BY_OPERATOR
local NOTE = 16             -- operator completions' note (absent in older records: read as '')
local OPERATOR = 17         -- the operator principal's name (idem)
local PRINCIPAL = 18        -- the principal the live token was granted to (absent in older records)
local RECEIPT_SEQ = 19      -- the completion's place in its agent's receipt chain (absent/0: none)
local STATEMENT = 20        -- the completion's signed receipt statement ('' until the gate stores it)
local RESERVED = 21         -- { {fencing, bucket, slot, amount}, ... } reservations (false/absent: none)
local RECEIPT_FORMAT = 22   -- how the receipt is read: 0 the writer's own, 1 JSON, 2 text (absent: 0)
local ASKED_ACTION = 23     -- the action type the latest grant was asked for (ledger::Asked; absent: '')
local ASKED_PARAMS = 24     -- its params as sent, JSON text; both dropped when the action completes

-- Values of STATE and SOURCE, and the slots of one OLDER entry.
local AUTHORIZED, COMPLETED, RELEASED = 1, 2, 3
local BY_WORKER, BY_OPERATOR = 1, 2
local G_TOKEN, G_FENCING = 1, 2

-- A record whose outcome is unknown (authorized, live or expired; released with superseded grants
-- still out) has no expiry: it stays until a Complete, a Release or an operator settles it.
-- Retention applies to settled records only.
--
-- The lease index of one agent, og:{<agent digest>}:leases, is a sorted set: member = the encoded
-- action key, score = LEASE_END, one member per unsettled record. It has no expiry either (Redis
-- deletes it with its last member). Every script that writes a record receives it as KEYS[2] and
-- the member as ARGV[1], and `save` keeps it in step; both keys share the agent's hash tag, so
-- Cluster runs the script on one slot.
-- Every reply starts with { now_ms, tag, ... }; src/store/redis/reply.rs decodes them in one place.
-- Time is Redis's own (TIME), so every gate replica agrees on when a lease ends.

-- Whether a record's outcome is unknown: authorized (live or expired), or released with
-- superseded grants still out. Such a record has no expiry and is in the lease index.
local function unsettled(rec)
  return rec[STATE] == AUTHORIZED or (rec[STATE] == RELEASED and #rec[OLDER] > 0)
end

-- The live record, or nil. A settled record past its expiry is absent even if the key lingers;
-- its expiry is the key's own (PEXPIRETIME), so that a sliding replay moves it with PEXPIRE
-- instead of rewriting the record (the EXPIRES_AT slot holds the expiry of the last full write).
local function load(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local rec = cmsgpack.unpack(raw)
  if not unsettled(rec) then
    local at = redis.call('PEXPIRETIME', key)
    if at > 0 and at <= NOW then
      return nil
    end
  end
  return rec
end

-- The expiry of a record settled now: the retention, unless superseded grants are still out.
local function settled_expiry(rec)
  if #rec[OLDER] > 0 then
    return 0
  end
  return NOW + rec[RETENTION]
end

-- Keeps the agent's lease index in step with a record just written: indexed while unsettled,
-- removed otherwise. (An index that still has the expiry older versions gave it loses it at the
-- start-up migration.)
local function index(rec)
  if unsettled(rec) then
    redis.call('ZADD', KEYS[2], rec[LEASE_END], ARGV[1])
  else
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
end

-- Expiries are absolute (PXAT, PEXPIREAT) on NOW's clock: a relative one (PX) counts from the
-- time Redis froze for the script, which can differ from TIME by a millisecond, and the key would
-- then outlive (or predecease) the expiry every script compares with NOW.
local function save(key, rec)
  if rec[EXPIRES_AT] == 0 then
    redis.call('SET', key, cmsgpack.pack(rec))
  else
    redis.call('SET', key, cmsgpack.pack(rec), 'PXAT', rec[EXPIRES_AT])
  end
  index(rec)
end

-- A completed record keeps no lease: who held it (HOLDER, PRINCIPAL) and until when (LEASE_END)
-- only matter while a grant is live, and every byte of a completed record is kept for its whole
-- retention.
local function settled_grant(rec)
  rec[HOLDER], rec[PRINCIPAL], rec[LEASE_END] = '', '', 0
  rec[ASKED_ACTION], rec[ASKED_PARAMS] = nil, nil
end

-- An operator completion (ledger::operator_completion): the live token, if any, joins the older
-- ones so that its holder hears COMPLETED_BY_OTHER.
local function operator_complete(rec, receipt, note, operator, format)
  if rec[STATE] == AUTHORIZED then
    table.insert(rec[OLDER], { [G_TOKEN] = rec[TOKEN], [G_FENCING] = rec[FENCING] })
  end
  rec[STATE], rec[EXPIRES_AT], rec[TOKEN] = COMPLETED, NOW + rec[RETENTION], ''
  rec[RECEIPT], rec[COMPLETED_AT], rec[COMPLETED_FENCING] = receipt, NOW, rec[FENCING]
  rec[SOURCE], rec[NOTE], rec[OPERATOR] = BY_OPERATOR, note, operator
  rec[RECEIPT_FORMAT] = format
  settled_grant(rec)
end

-- A record with every slot set: the request's identity and state; no token, no completion yet.
-- Every slot up to RECEIPT_FORMAT holds a value (false for no reservations), so cmsgpack packs
-- the record as an array: a table with a gap packs as a map of slot numbers, and Redis then runs
-- about 6% more instructions per grant and completion (`make bench SCENARIO=instructions`).
-- Records stored as maps by earlier versions unpack to the same table.
local function new_record(state, fencing, fingerprint, digests, retention, sliding, expires_at)
  return { [STATE] = state, [FENCING] = fencing, [FINGERPRINT] = fingerprint,
           [DIGESTS] = digests, [RETENTION] = retention, [SLIDING] = sliding,
           [EXPIRES_AT] = expires_at, [TOKEN] = '', [HOLDER] = '', [LEASE_END] = 0, [OLDER] = {},
           [RECEIPT] = '', [COMPLETED_AT] = 0, [COMPLETED_FENCING] = 0, [SOURCE] = 0, [NOTE] = '',
           [OPERATOR] = '', [PRINCIPAL] = '', [RECEIPT_SEQ] = 0, [STATEMENT] = '', [RESERVED] = false,
           [RECEIPT_FORMAT] = 0 }
end

local function find_older(rec, token)
  for i, g in ipairs(rec[OLDER]) do
    if g[G_TOKEN] == token then
      return i, g[G_FENCING]
    end
  end
  return nil, nil
end

-- The completion fields of a reply end with the receipt chain's (seq, statement), the receipt's
-- format, and the seq of the chain entry the script just appended (0: none), which tells the gate
-- that the agent's chain has an entry to seal.
local function completion_reply(tag, rec, recorded, double, chained)
  return { NOW, tag, recorded, double, rec[RECEIPT], rec[COMPLETED_AT], rec[COMPLETED_FENCING],
           rec[TOKEN], rec[SOURCE], rec[NOTE] or '', rec[OPERATOR] or '', rec[RECEIPT_SEQ] or 0,
           rec[STATEMENT] or '', rec[RECEIPT_FORMAT] or 0, chained or 0 }
end

-- Receipt chains. One agent's chain is a list, og:{<agent digest>}:receipts (KEYS[3] of the
-- scripts that record completions, in the agent's slot), of MessagePack entries
-- { seq, member (the encoded action key), fingerprint, receipt digest, fencing, source,
--   completed_at, statement }. The statement is '' until the gate seals the chain (seal.lua, once
-- per sealing interval, signing its last entry: a head covers every entry before it). Appending
-- here, in the script that records the completion, is what keeps the chain from forking: its
-- order is the order Redis ran the completions in.
local E_STATEMENT = 8

-- Appends the completion just recorded in rec to the chain when `digest` (the receipt's SHA-256,
-- from the gate) is given; call it before save(). Returns the entry's seq (0: not chained), for
-- completion_reply.
local function chain(rec, digest)
  rec[RECEIPT_SEQ], rec[STATEMENT] = 0, ''
  if digest == '' then
    return 0
  end
  local seq = redis.call('LLEN', KEYS[3]) + 1
  rec[RECEIPT_SEQ] = seq
  redis.call('RPUSH', KEYS[3], cmsgpack.pack({ seq, ARGV[1], rec[FINGERPRINT], digest,
    rec[COMPLETED_FENCING], rec[SOURCE], rec[COMPLETED_AT], '' }))
  return seq
end

-- Budgets and approvals (domain::authorization, mirrored here). Only scripts that grant or release
-- call these, and only when the request carries a hold or charges, or the record reservations.
local R_FENCING, R_BUCKET, R_SLOT, R_AMOUNT = 1, 2, 3, 4

-- A budget bucket (a field of the agent's budgets hash, og:{<agent digest>}:budgets):
-- { action, group, { slot start, amount, slot start, amount, ... } }, oldest slot first. A window
-- is counted in SLOTS slots; a slot counts while any part of it is inside the window.
local SLOTS = 60

local function slot_len(window)
  return math.max(1, math.floor((window + SLOTS - 1) / SLOTS))
end

local function slot_counts(start, window)
  return start + slot_len(window) > NOW - window
end

local function bucket_used(b, window)
  local used, slots = 0, b[3]
  for i = 1, #slots, 2 do
    if slot_counts(slots[i], window) then
      used = used + slots[i + 1]
    end
  end
  return used
end

-- How long until `amount` more fits under `limit` (-1: never, the amount alone is above it).
local function bucket_fits_in(b, limit, amount, window)
  if amount > limit then
    return -1
  end
  local used, slots = bucket_used(b, window), b[3]
  for i = 1, #slots, 2 do
    if slot_counts(slots[i], window) then
      used = used - slots[i + 1]
      if used + amount <= limit then
        return math.max(1, slots[i] + slot_len(window) + window - NOW)
      end
    end
  end
  return 1
end

local function bucket_load(hash, id)
  local raw = redis.call('HGET', hash, id)
  if not raw then
    return nil
  end
  return cmsgpack.unpack(raw)
end

-- Stores a bucket (an empty one is removed); the hash lives at least as long as its longest window.
local function bucket_save(hash, id, b, window)
  if #b[3] == 0 then
    redis.call('HDEL', hash, id)
    return
  end
  redis.call('HSET', hash, id, cmsgpack.pack(b))
  local keep = window + slot_len(window)
  if redis.call('PTTL', hash) < keep then
    redis.call('PEXPIRE', hash, keep)
  end
end

-- Charges a grant to every bucket, all or nothing (budget::charge): a refusal reply, or nil and
-- the reservations made. charges: { {bucket, budget, action, group, limit, window, amount}, ... }.
local function budget_charge(hash, charges, fencing)
  local loaded = {}
  for i, c in ipairs(charges) do
    local b = bucket_load(hash, c[1]) or { c[3], c[4], {} }
    loaded[i] = b
    local used = bucket_used(b, c[6])
    if used + c[7] > c[5] then
      return { NOW, 'budget_exceeded', c[2], bucket_fits_in(b, c[5], c[7], c[6]), used, c[5], c[7] }, nil
    end
  end
  local reserved = {}
  for i, c in ipairs(charges) do
    local b, window = loaded[i], c[6]
    b[1], b[2] = c[3], c[4]
    local kept = {}
    for j = 1, #b[3], 2 do
      if slot_counts(b[3][j], window) then
        table.insert(kept, b[3][j])
        table.insert(kept, b[3][j + 1])
      end
    end
    local slot = math.floor(NOW / slot_len(window)) * slot_len(window)
    if #kept > 0 and kept[#kept - 1] == slot then
      kept[#kept] = kept[#kept] + c[7]
    else
      table.insert(kept, slot)
      table.insert(kept, c[7])
    end
    b[3] = kept
    bucket_save(hash, c[1], b, window)
    table.insert(reserved, { [R_FENCING] = fencing, [R_BUCKET] = c[1], [R_SLOT] = slot, [R_AMOUNT] = c[7] })
  end
  return nil, reserved
end

-- Gives a released grant's reservations back (authorization::release); the others stay.
local function budget_give_back(hash, rec, fencing)
  local kept = {}
  for _, r in ipairs(rec[RESERVED] or {}) do
    if r[R_FENCING] == fencing then
      local b = bucket_load(hash, r[R_BUCKET])
      if b then
        local slots, rest = b[3], {}
        for j = 1, #slots, 2 do
          local amount = slots[j + 1]
          if slots[j] == r[R_SLOT] then
            amount = math.max(0, amount - r[R_AMOUNT])
          end
          if amount > 0 then
            table.insert(rest, slots[j])
            table.insert(rest, amount)
          end
        end
        b[3] = rest
        if #rest == 0 then
          redis.call('HDEL', hash, r[R_BUCKET])
        else
          redis.call('HSET', hash, r[R_BUCKET], cmsgpack.pack(b))
        end
      end
    else
      table.insert(kept, r)
    end
  end
  rec[RESERVED] = kept
end

-- An approval (og:{<agent digest>}:<action digest>:approval, with PXAT when it lapses):
-- { id, fingerprint, digests, state, created_at, expires_at, policy, reason, action, operator, note,
--   params } (params: the request's params as sent; absent in approvals stored before it was kept)
local A_ID, A_FINGERPRINT, A_DIGESTS, A_STATE, A_CREATED, A_EXPIRES = 1, 2, 3, 4, 5, 6
local A_POLICY, A_REASON, A_ACTION, A_OPERATOR, A_NOTE, A_PARAMS = 7, 8, 9, 10, 11, 12
local PENDING, APPROVED, DENIED, USED = 1, 2, 3, 4

local function approval_load(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local a = cmsgpack.unpack(raw)
  if a[A_EXPIRES] <= NOW then
    return nil
  end
  return a
end

-- Stores an approval until it lapses, and keeps the agent's approvals index (score: the lapse
-- time) in step, dropping lapsed members.
local function approval_save(key, index, member, a)
  redis.call('SET', key, cmsgpack.pack(a), 'PXAT', a[A_EXPIRES])
  redis.call('ZADD', index, a[A_EXPIRES], member)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', NOW)
end

local function approval_pending_reply(a)
  return { NOW, 'pending_approval', a[A_ID], a[A_EXPIRES], a[A_POLICY], a[A_REASON] }
end

-- What a held grant meets (approval::meet): a reply to give instead of the grant, or nil and the
-- approval to store with the grant (used). hold: { policy, reason, new_id, ttl, action, params }.
local function approval_meet(key, index, member, hold, fingerprint, digests)
  local a = approval_load(key)
  if a and a[A_STATE] == USED then
    a = nil
  end
  if a and a[A_FINGERPRINT] ~= fingerprint then
    return { NOW, 'key_reused', a[A_DIGESTS] }, nil
  end
  if a and a[A_STATE] == APPROVED then
    a[A_STATE] = USED
    return nil, a
  end
  if a and a[A_STATE] == DENIED then
    return { NOW, 'approval_denied', a[A_ID] }, nil
  end
  if a then
    return approval_pending_reply(a), nil
  end
  a = { hold[3], fingerprint, digests, PENDING, NOW, NOW + hold[4], hold[1], hold[2], hold[5], '', '',
        hold[6] }
  approval_save(key, index, member, a)
  return approval_pending_reply(a), nil
end
