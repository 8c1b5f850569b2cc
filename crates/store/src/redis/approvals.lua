-- ListApprovals, one batch of one agent: reads the approvals of index members, in index order,
-- and drops members whose approval lapsed.
-- KEYS[1]: the agent's approvals index
-- KEYS[2..n+1]: the approval keys of the members, in the same order as ARGV
-- ARGV[1..n]: the members (encoded action keys), in index order
-- Returns: { now, 'approvals', n, then per member: approval (MessagePack) or '' when lapsed }
local out = { NOW, 'approvals', #ARGV }
for i, member in ipairs(ARGV) do
  local a = approval_load(KEYS[i + 1])
  if a then
    table.insert(out, cmsgpack.pack(a))
  else
    redis.call('ZREM', KEYS[1], member)
    table.insert(out, '')
  end
end
return out
