-- Release: give the live (or expired) token back; the fencing number and the superseded grants
-- are kept (while any is out, the record stays unsettled, without expiry).
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: token
-- KEYS[3]: the agent's budgets hash (a released grant's reservations go back to it)
-- Returns: { now, 'released', fencing } | { now, 'token_unknown' } | { now, 'token_mismatch' }
--        | { now, 'already_completed' }
local key, token = KEYS[1], ARGV[2]

local rec = load(key)
if not rec then
  return { NOW, 'token_unknown' }
end
if rec[STATE] == COMPLETED then
  return { NOW, 'already_completed' }
end
if rec[TOKEN] ~= token then
  return { NOW, 'token_mismatch' }
end
if rec[STATE] == AUTHORIZED then
  if rec[RESERVED] then budget_give_back(KEYS[3], rec, rec[FENCING]) end
  rec[STATE], rec[LEASE_END] = RELEASED, NOW
  rec[EXPIRES_AT] = settled_expiry(rec)
  save(key, rec)
end
-- state 3 with the same token: a repeated release is a no-op
return { NOW, 'released', rec[FENCING] }
