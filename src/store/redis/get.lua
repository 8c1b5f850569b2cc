-- GetAction: the record as it stands, judged on the store clock.
-- KEYS[1]: the action's record key (KEYS[2], ARGV[1]: the lease index and member, unused)
-- Returns: { now, 'view', state (1 absent, 2 authorized, 3 completed, 4 expired), fencing,
--            fingerprint, lease_expires_at, holder, has_completion (0/1),
--            receipt, completed_at, completed_fencing, token, source, note, operator }
local rec = load(KEYS[1])
if not rec then
  return { NOW, 'view', 1, 0, '', 0, '', 0, '', 0, 0, '', 0, '', '' }
end
if rec[1] == 3 then
  return { NOW, 'view', 1, rec[2], rec[3], 0, '', 0, '', 0, 0, '', 0, '', '' }
end
if rec[1] == 2 then
  return { NOW, 'view', 3, rec[2], rec[3], 0, '', 1, rec[12], rec[13], rec[14], rec[8], rec[15],
         rec[16] or '', rec[17] or '' }
end
local state = 2
if NOW >= rec[10] then
  state = 4
end
return { NOW, 'view', state, rec[2], rec[3], rec[10], rec[9], 0, '', 0, 0, '', 0, '', '' }
