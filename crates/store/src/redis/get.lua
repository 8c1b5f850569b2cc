-- GetAction: the record as it stands, judged on the store clock.
-- KEYS[1]: the action's record key (KEYS[2], ARGV[1]: the lease index and member, unused)
-- Returns: { now, 'view', state (1 absent, 2 authorized, 3 completed, 4 expired), fencing,
--            fingerprint, lease_expires_at, holder, has_completion (0/1),
--            receipt, completed_at, completed_fencing, token, source, note, operator, seq,
--            statement, receipt_format, unsettled_token, asked_action, asked_params }  (the live
--            or expired grant's token, or the newest superseded one's; the action type and params
--            its latest grant was asked for, while unsettled)
local rec = load(KEYS[1])
if not rec then
  return { NOW, 'view', 1, 0, '', 0, '', 0, '', 0, 0, '', 0, '', '', 0, '', 0, '', '', '' }
end
if rec[STATE] == RELEASED and #rec[OLDER] > 0 then
  -- superseded grants still out: unresolved, named by the newest of them
  local newest = rec[OLDER][#rec[OLDER]]
  return { NOW, 'view', 4, newest[G_FENCING], rec[FINGERPRINT], rec[LEASE_END], '', 0, '', 0, 0,
           '', 0, '', '', 0, '', 0, newest[G_TOKEN], rec[ASKED_ACTION] or '', rec[ASKED_PARAMS] or '' }
end
if rec[STATE] == RELEASED then
  return { NOW, 'view', 1, rec[FENCING], rec[FINGERPRINT], 0, '', 0, '', 0, 0, '', 0, '', '', 0, '', 0, '', '', '' }
end
if rec[STATE] == COMPLETED then
  return { NOW, 'view', 3, rec[FENCING], rec[FINGERPRINT], 0, '', 1, rec[RECEIPT], rec[COMPLETED_AT],
           rec[COMPLETED_FENCING], rec[TOKEN], rec[SOURCE],
         rec[NOTE] or '', rec[OPERATOR] or '', rec[RECEIPT_SEQ] or 0, rec[STATEMENT] or '',
         rec[RECEIPT_FORMAT] or 0, '', '', '' }
end
local state = 2
if NOW >= rec[LEASE_END] then
  state = 4
end
return { NOW, 'view', state, rec[FENCING], rec[FINGERPRINT], rec[LEASE_END], rec[HOLDER], 0, '', 0, 0,
         '', 0, '', '', 0, '', 0, rec[TOKEN], rec[ASKED_ACTION] or '', rec[ASKED_PARAMS] or '' }
