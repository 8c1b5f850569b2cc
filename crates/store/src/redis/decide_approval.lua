-- DecideApproval: an operator approves or denies the approval of one action (approval::decide).
-- KEYS[1]: the action's record key (unused; every per-action script gets it)
-- KEYS[2]: the agent's lease index (unused)
-- KEYS[3]: the action's approval, og:{<agent digest>}:<action digest>:approval
-- KEYS[4]: the agent's approvals index, og:{<agent digest>}:approvals
-- ARGV[1]: the index member, the encoded action key
-- ARGV[2]: the approval id
-- ARGV[3]: '1' to approve, '0' to deny
-- ARGV[4]: operator (the principal's name)
-- ARGV[5]: note
-- Returns: { now, 'approval', changed (0/1), approval (MessagePack, the layout in prelude.lua) }
--        | { now, 'not_pending', state (0: none with that id, else its state) }
local a = approval_load(KEYS[3])
if not a or a[A_ID] ~= ARGV[2] then
  return { NOW, 'not_pending', 0 }
end
local target = DENIED
if ARGV[3] == '1' then
  target = APPROVED
end
if a[A_STATE] == PENDING then
  a[A_STATE], a[A_OPERATOR], a[A_NOTE] = target, ARGV[4], ARGV[5]
  approval_save(KEYS[3], KEYS[4], ARGV[1], a)
  return { NOW, 'approval', 1, cmsgpack.pack(a) }
end
if a[A_STATE] == target then
  return { NOW, 'approval', 0, cmsgpack.pack(a) }
end
return { NOW, 'not_pending', a[A_STATE] }
