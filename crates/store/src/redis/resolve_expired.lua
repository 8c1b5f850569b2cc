-- ResolveExpired: an operator settles a lease that ended without Complete or Release, or (on a
-- released record) the newest superseded grant still out; 'failed' settles that one grant.
-- KEYS[1]: the action's record key
-- KEYS[2]: the agent's lease index
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: 'completed' or 'failed'
-- ARGV[3]: receipt (bytes; 'completed' only)
-- ARGV[4]: note ('completed' only; kept with the completion)
-- ARGV[5]: operator (the principal's name)
-- ARGV[6]: the receipt's SHA-256 (hex) to chain the completion with ('completed'); '' for no chain
-- ARGV[7]: the receipt's format ('completed'): 0 unspecified, 1 JSON, 2 text
-- ARGV[8]: the expected fencing number of the unresolved grant (a resolver's); '' for any
-- KEYS[3]: the agent's receipt chain (used with ARGV[6])
-- KEYS[4]: the agent's budgets hash ('failed' gives the grant's budget reservations back)
-- Returns: { now, 'completed', 1, 0, receipt, completed_at, fencing, token, source, note, operator,
--            seq, statement, receipt_format, chained seq (0: not chained) }
--        | { now, 'released', fencing }
--        | { now, 'not_expired', state (1 absent, 2 authorized) } | { now, 'already_completed' }
--        | { now, 'already_settled', state (1 absent, 2 authorized, 4 expired), fencing }
local key, resolution = KEYS[1], ARGV[2]
if resolution ~= 'completed' and resolution ~= 'failed' then
  return redis.error_reply('ERR oncegate: resolution must be completed or failed')
end
local expected = ARGV[8] ~= '' and tonumber(ARGV[8]) or nil

local rec = load(key)
if not rec or (rec[STATE] == RELEASED and #rec[OLDER] == 0) then
  if expected then return { NOW, 'already_settled', 1, rec and rec[FENCING] or 0 } end
  return { NOW, 'not_expired', 1 }
end
if rec[STATE] == COMPLETED then
  return { NOW, 'already_completed' }
end
if rec[STATE] == AUTHORIZED and NOW < rec[LEASE_END] then
  if expected then return { NOW, 'already_settled', 2, rec[FENCING] } end
  return { NOW, 'not_expired', 2 }
end
-- EXPIRED: the unresolved grant is the live one's, or (released) the newest superseded one's.
local unresolved = rec[FENCING]
if rec[STATE] == RELEASED then unresolved = rec[OLDER][#rec[OLDER]][G_FENCING] end
if expected and expected ~= unresolved then
  return { NOW, 'already_settled', 4, unresolved }
end
if resolution == 'completed' then
  operator_complete(rec, ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[7]) or 0)
  local chained = chain(rec, ARGV[6])
  save(key, rec)
  return completion_reply('completed', rec, 1, 0, chained)
end
-- failed: the expired grant had no effect. An authorized record is released (the expired token
-- and the fencing number kept, as Release does); on a released one the newest superseded grant
-- is dropped.
local fencing = rec[FENCING]
if rec[STATE] == AUTHORIZED then
  rec[STATE], rec[LEASE_END] = RELEASED, NOW
else
  fencing = rec[OLDER][#rec[OLDER]][G_FENCING]
  table.remove(rec[OLDER])
end
if rec[RESERVED] then budget_give_back(KEYS[4], rec, fencing) end
rec[EXPIRES_AT] = settled_expiry(rec)
save(key, rec)
return { NOW, 'released', fencing }
