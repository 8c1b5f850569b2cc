-- Complete: record the outcome of an attempt (idempotent for the same token).
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: token
-- ARGV[3]: receipt (bytes)
-- ARGV[4]: the receipt's SHA-256 (hex) to chain a recorded completion with; '' for no chain
-- KEYS[3]: the agent's receipt chain (used with ARGV[4])
-- Returns: { now, 'completed', recorded (0/1), double_execution (0/1), receipt, completed_at,
--            fencing, token, source, note, operator, seq, statement, receipt_format, chained seq
--            (0: not chained) }
--        | { now, 'token_unknown' } | { now, 'token_mismatch' }
--        | { now, 'completed_by_other', fencing, completed_at }
local key, token, receipt = KEYS[1], ARGV[2], ARGV[3]

local rec = load(key)
if not rec then
  return { NOW, 'token_unknown' }
end
local superseded, old_fencing = find_older(rec, token)

local function record(fencing, double)
  local i = find_older(rec, token)
  if i then
    table.remove(rec[OLDER], i)
  end
  rec[STATE], rec[EXPIRES_AT], rec[TOKEN] = COMPLETED, NOW + rec[RETENTION], token
  rec[RECEIPT], rec[COMPLETED_AT], rec[COMPLETED_FENCING] = receipt, NOW, fencing
  rec[SOURCE], rec[NOTE], rec[OPERATOR] = BY_WORKER, '', ''
  settled_grant(rec)
  local chained = chain(rec, ARGV[4])
  save(key, rec)
  return completion_reply('completed', rec, 1, double, chained)
end

if rec[STATE] == COMPLETED then
  if rec[TOKEN] == token and rec[SOURCE] == BY_WORKER then
    return completion_reply('completed', rec, 0, 0)
  end
  if superseded then
    return { NOW, 'completed_by_other', rec[COMPLETED_FENCING], rec[COMPLETED_AT] }
  end
  return { NOW, 'token_mismatch' }
end
if rec[STATE] == AUTHORIZED and rec[TOKEN] == token then
  return record(rec[FENCING], 0)
end
if not superseded then
  return { NOW, 'token_mismatch' }
end
if rec[STATE] == AUTHORIZED then
  -- A superseded holder finished after a newer grant: recorded (the effect happened); the newer
  -- holder will hear COMPLETED_BY_OTHER.
  table.insert(rec[OLDER], { [G_TOKEN] = rec[TOKEN], [G_FENCING] = rec[FENCING] })
  return record(old_fencing, 1)
end
-- released: the newer grant definitely had no effect, so this one's is the only one
return record(old_fencing, 0)
