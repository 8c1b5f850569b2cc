-- RequestToken: grant, re-deliver to the same holder, replay a completion, or refuse.
-- KEYS[1]: the action's record key, og:{<agent digest>}:<action digest>
-- KEYS[2]: the agent's lease index, og:{<agent digest>}:leases
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: fingerprint (request hash)
-- ARGV[3]: field digests ('' when keyed by fingerprint)
-- ARGV[4]: holder ('' for none)
-- ARGV[5]: the new token, used only if this call grants
-- ARGV[6]: lease in ms (> 0)
-- ARGV[7]: retention in ms (> 0)
-- ARGV[8]: sliding retention, '1' or '0'
-- ARGV[9]: on expiry, 'reconcile' or 'regrant'
-- ARGV[10]: the asking principal (a live token is redelivered only to the one it was granted to)
-- ARGV[11]: the most superseded grants a record keeps (a regrant beyond it is refused)
-- ARGV[12]: a rule's hold, MessagePack { policy, reason, new_id, ttl, action }, or '' (none)
-- ARGV[13]: budget charges, MessagePack { {bucket, budget, action, group, limit, window, amount}, ... }, or ''
-- ARGV[14]: the action type asked for (kept with a new grant for resolvers)
-- ARGV[15]: the params as sent, JSON text (idem)
-- KEYS[3..5], only with a hold or charges: the agent's budgets hash, the action's approval, the
--   agent's approvals index (og:{<agent digest>}:budgets, …:<action digest>:approval, …:approvals)
-- Returns: { now, 'granted', kind (1 new, 2 redelivered, 3 regranted), token, fencing, lease_expires_at,
--            opened (1: a new grant whose member is the only one in the agent's lease index) }
--        | { now, 'completed', 0, 0, receipt, completed_at, fencing, token, source, note, operator,
--            seq, statement, receipt_format, '', '' }
--        | { now, 'key_reused', stored_digests }
--        | { now, 'in_progress', retry_after_ms }
--        | { now, 'lease_expired', token, fencing, lease_expired_at }
--        | { now, 'pending_approval', approval_id, expires_at, policy, reason }
--        | { now, 'approval_denied', approval_id } | { now, 'budget_exceeded', budget, retry_after_ms (-1: never),
--          used, limit, requested }
local key = KEYS[1]
local fingerprint, digests, holder, new_token = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lease, retention = tonumber(ARGV[6]), tonumber(ARGV[7])
local sliding, on_expiry = tonumber(ARGV[8]), ARGV[9]
local principal, max_superseded = ARGV[10], tonumber(ARGV[11])
local hold, charges = nil, nil
if ARGV[12] and ARGV[12] ~= '' then hold = cmsgpack.unpack(ARGV[12]) end
if ARGV[13] and ARGV[13] ~= '' then charges = cmsgpack.unpack(ARGV[13]) end
if not lease or lease <= 0 or not retention or retention <= 0 or not max_superseded then
  return redis.error_reply('ERR oncegate: lease, retention and max_superseded must be numbers')
end

-- Unsettled records have no expiry (EXPIRES_AT 0): the key is kept until someone settles it.
-- `carried`: the reservations of the superseded grants (a regrant keeps them).
local function grant(fencing, older, kind, nx, carried)
  -- Holds and budgets (authorization::request_token): only for a new token, only when asked.
  local used_approval, reserved = nil, carried
  if hold then
    local blocked
    blocked, used_approval = approval_meet(KEYS[4], KEYS[5], ARGV[1], hold, fingerprint, digests)
    if blocked then return blocked end
  end
  if charges then
    local refused, made = budget_charge(KEYS[3], charges, fencing)
    if refused then return refused end
    reserved = reserved or {}
    for _, r in ipairs(made) do table.insert(reserved, r) end
  end
  if used_approval then approval_save(KEYS[4], KEYS[5], ARGV[1], used_approval) end
  local rec = new_record(AUTHORIZED, fencing, fingerprint, digests, retention, sliding, 0)
  rec[TOKEN], rec[HOLDER], rec[LEASE_END] = new_token, holder, NOW + lease
  rec[OLDER], rec[PRINCIPAL], rec[RESERVED] = older, principal, reserved or false
  rec[ASKED_ACTION], rec[ASKED_PARAMS] = ARGV[14] or '', ARGV[15] or ''
  if nx then
    -- A brand-new action: SET NX, as the design asks; the script already runs atomically, so NX
    -- failing would mean a lingering expired key, which we overwrite.
    if redis.call('SET', key, cmsgpack.pack(rec), 'NX') then
      index(rec)
    else
      save(key, rec)
    end
  else
    save(key, rec)
  end
  -- Whether this grant opened the agent's lease index (no other member in it): only then may the
  -- agent be missing from the agents index, and the gate then adds it (agents.rs).
  local opened = 0
  if kind == 1 and redis.call('ZCARD', KEYS[2]) == 1 then
    opened = 1
  end
  return { NOW, 'granted', kind, new_token, fencing, rec[LEASE_END], opened }
end

local rec = load(key)
if not rec then
  -- The store clock in microseconds: fencing never goes backwards, even after a forgotten record.
  return grant(NOW * 1000 + 1, {}, 1, true)
end
if rec[STATE] == RELEASED and #rec[OLDER] == 0 then
  return grant(rec[FENCING] + 1, {}, 1, false)
end
if rec[FINGERPRINT] ~= fingerprint then
  return { NOW, 'key_reused', rec[DIGESTS] }
end
if rec[STATE] == COMPLETED then
  if rec[SLIDING] == 1 then
    -- The retention slides: the key's expiry moves, the record is not rewritten.
    redis.call('PEXPIREAT', key, NOW + rec[RETENTION])
  end
  return completion_reply('completed', rec, 0, 0)
end
if rec[STATE] == AUTHORIZED and NOW < rec[LEASE_END] then
  if holder ~= '' and holder == rec[HOLDER] and principal == (rec[PRINCIPAL] or '') then
    return { NOW, 'granted', 2, rec[TOKEN], rec[FENCING], rec[LEASE_END], 0 }
  end
  return { NOW, 'in_progress', rec[LEASE_END] - NOW }
end
-- Unresolved: an authorized record whose lease ended, or a released one whose superseded grants
-- are still out (the newest of them is the one to reconcile).
local token, fencing, supersede = rec[TOKEN], rec[FENCING], true
if rec[STATE] == RELEASED then
  local newest = rec[OLDER][#rec[OLDER]]
  token, fencing, supersede = newest[G_TOKEN], newest[G_FENCING], false
end
local refusal = { NOW, 'lease_expired', token, fencing, rec[LEASE_END] }
if on_expiry ~= 'regrant' then
  return refusal
end
local older = rec[OLDER]
if supersede then
  table.insert(older, { [G_TOKEN] = token, [G_FENCING] = fencing })
end
if #older > max_superseded then
  return refusal
end
return grant(rec[FENCING] + 1, older, 3, false, rec[RESERVED])
