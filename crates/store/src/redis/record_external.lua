-- RecordExternalCompletion: an operator marks an action completed that was done by hand.
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: receipt (bytes)
-- ARGV[3]: note
-- ARGV[4]: operator (the principal's name)
-- ARGV[5]: '1' when the request hash below is given, '0' otherwise
-- ARGV[6]: fingerprint (request hash)
-- ARGV[7]: field digests ('' when keyed by fingerprint)
-- ARGV[8]: retention in ms (> 0 when ARGV[5] is '1')
-- ARGV[9]: sliding retention, '1' or '0'
-- ARGV[10]: the receipt's SHA-256 (hex) to chain a recorded completion with; '' for no chain
-- ARGV[11]: the receipt's format: 0 unspecified, 1 JSON, 2 text
-- KEYS[3]: the agent's receipt chain (used with ARGV[10])
-- Returns: { now, 'completed', recorded (0/1), 0, receipt, completed_at, fencing, token, source, note,
--            operator, seq, statement, receipt_format, chained seq (0: not chained) }
--        | { now, 'key_reused', stored_digests } | { now, 'request_required' }
--        | { now, 'already_completed' }
local key, receipt, note, operator = KEYS[1], ARGV[2], ARGV[3], ARGV[4]
local format = tonumber(ARGV[11]) or 0
local has_request, fingerprint, digests = ARGV[5] == '1', ARGV[6], ARGV[7]
local retention, sliding = tonumber(ARGV[8]), tonumber(ARGV[9])
if has_request and (not retention or retention <= 0) then
  return redis.error_reply('ERR oncegate: retention must be positive')
end

local rec = load(key)
-- A plain tombstone binds nothing; any other record binds the key to its request.
local bound = rec and not (rec[STATE] == RELEASED and #rec[OLDER] == 0)
if bound and has_request and rec[FINGERPRINT] ~= fingerprint then
  return { NOW, 'key_reused', rec[DIGESTS] }
end
if not bound then
  if not has_request then
    return { NOW, 'request_required' }
  end
  local fencing = 0
  if rec then
    fencing = rec[FENCING]
  end
  rec = new_record(RELEASED, fencing, fingerprint, digests, retention, sliding, NOW + retention)
  operator_complete(rec, receipt, note, operator, format)
  local chained = chain(rec, ARGV[10])
  save(key, rec)
  return completion_reply('completed', rec, 1, 0, chained)
end
if rec[STATE] == COMPLETED then
  if rec[SOURCE] == BY_OPERATOR and rec[RECEIPT] == receipt and (rec[OPERATOR] or '') == operator
      and (rec[RECEIPT_FORMAT] or 0) == format then
    return completion_reply('completed', rec, 0, 0)
  end
  return { NOW, 'already_completed' }
end
-- authorized (live or expired), or released with superseded grants out
operator_complete(rec, receipt, note, operator, format)
local chained = chain(rec, ARGV[10])
save(key, rec)
return completion_reply('completed', rec, 1, 0, chained)
