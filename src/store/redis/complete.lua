-- Complete: record the outcome of an attempt (idempotent for the same token).
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: token
-- ARGV[3]: receipt (bytes)
-- Returns: { now, 'completed', recorded (0/1), double_execution (0/1), receipt, completed_at, fencing,
--            token, source, note, operator }
--        | { now, 'token_unknown' } | { now, 'token_mismatch' }
--        | { now, 'completed_by_other', fencing, completed_at }
local key, token, receipt = KEYS[1], ARGV[2], ARGV[3]

local rec = load(key)
if not rec then
  return { NOW, 'token_unknown' }
end

local function record(fencing, double)
  local i = find_older(rec, token)
  if i then
    table.remove(rec[11], i)
  end
  rec[1], rec[7], rec[8] = 2, NOW + rec[5], token
  rec[12], rec[13], rec[14], rec[15], rec[16], rec[17] = receipt, NOW, fencing, 1, '', ''
  save(key, rec)
  return completion_reply('completed', rec, 1, double)
end

if rec[1] == 2 then
  if rec[8] == token and rec[15] == 1 then
    return completion_reply('completed', rec, 0, 0)
  end
  if find_older(rec, token) then
    return { NOW, 'completed_by_other', rec[14], rec[13] }
  end
  return { NOW, 'token_mismatch' }
end
if rec[1] == 3 then
  return { NOW, 'token_mismatch' }
end
-- authorized (live or expired): the live token completes; a superseded one is still recorded
if rec[8] == token then
  return record(rec[2], 0)
end
local _, old_fencing = find_older(rec, token)
if not old_fencing then
  return { NOW, 'token_mismatch' }
end
table.insert(rec[11], { rec[8], rec[2] })
return record(old_fencing, 1)
