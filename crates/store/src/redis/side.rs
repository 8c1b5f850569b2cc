//! Approvals and budgets on Redis, besides the worker scripts that decide them: an operator's
//! decision on an approval, the listing of one agent's approvals, and one agent's budget buckets.

use super::{Decoded, Extra, Ran, RedisStore, confirmed, keys, unexpected};
use crate::{ApprovalEntry, ApprovalPage, ListCursor, Reply, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{Approval, Bucket, approval::Decision},
};

/// Members read from the approvals index per round trip.
const BATCH: usize = 64;

impl RedisStore {
    /// DecideApproval, held to the durability level like an operator completion.
    pub async fn decide_approval(
        &self,
        key: &ActionKey,
        decision: &Decision,
        replicas: u32,
    ) -> Result<Reply<(Approval, bool)>, StoreError> {
        let args: [&[u8]; 4] = [
            decision.id.as_bytes(),
            if decision.approve { b"1" } else { b"0" },
            decision.operator.as_bytes(),
            decision.note.as_bytes(),
        ];
        let wait = self.wait_for(replicas);
        let Ran {
            now,
            decoded,
            acknowledged,
        } = self
            .run(
                &self.scripts.decide_approval,
                key,
                &[Extra::Approval, Extra::Approvals],
                &args,
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Approval(approval, changed) => {
                if changed {
                    confirmed(wait, acknowledged, "approval decision")?;
                }
                Ok((approval, changed))
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("decide_approval", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    /// One agent's live approvals after `after`, by lapse time then member: the index read a
    /// batch at a time, each member checked against its approval (lapsed ones dropped).
    pub async fn list_approvals(
        &self,
        agent_id: &str,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<ApprovalPage>, StoreError> {
        self.eviction.check()?;
        let index = keys::Agent::new(agent_id).approvals();
        let mut page = ApprovalPage::default();
        let mut from = after.map(|c| (c.lease_expires_at, c.key.clone()));
        loop {
            let min = from
                .as_ref()
                .map_or("-inf".to_owned(), |(score, _)| score.to_string());
            let mut range = redis::cmd("ZRANGE");
            range
                .arg(&index)
                .arg(&min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(BATCH + limit)
                .arg("WITHSCORES");
            let entries: Vec<(Vec<u8>, f64)> = self.query(&range).await?;
            let fetched = entries.len();
            let members: Vec<(Vec<u8>, i64)> = entries
                .into_iter()
                .map(|(m, s)| (m, s as i64))
                .filter(|(m, s)| from.as_ref().is_none_or(|(fs, fk)| (*s, m) > (*fs, fk)))
                .collect();
            let mut invocation = self.scripts.approvals.key(&index);
            let mut keyed = Vec::with_capacity(members.len());
            for (member, score) in &members {
                let Some(action) = ActionKey::decode(member) else {
                    continue;
                };
                invocation
                    .key(keys::approval(&action))
                    .arg(member.as_slice());
                keyed.push((action, *score));
            }
            let (now, decoded) = self.invoke(invocation).await?;
            let Decoded::Approvals(found) = decoded else {
                return Err(unexpected("approvals", &decoded));
            };
            for ((action, score), approval) in keyed.into_iter().zip(found) {
                from = Some((score, action.encode()));
                if let Some(approval) = approval {
                    page.items.push(ApprovalEntry {
                        key: action,
                        approval,
                    });
                    if page.items.len() >= limit {
                        page.next = from.as_ref().map(|(score, key)| ListCursor {
                            agent_id: agent_id.to_owned(),
                            lease_expires_at: *score,
                            key: key.clone(),
                        });
                        return Ok(Reply {
                            now,
                            result: Ok(page),
                            replicas: 0,
                        });
                    }
                }
            }
            if fetched < BATCH + limit {
                return Ok(Reply {
                    now,
                    result: Ok(page),
                    replicas: 0,
                });
            }
        }
    }

    /// Every budget bucket of one agent, as stored.
    pub async fn budgets(
        &self,
        agent_id: &str,
    ) -> Result<Reply<Vec<(String, Bucket)>>, StoreError> {
        self.eviction.check()?;
        let invocation = self
            .scripts
            .budgets
            .key(keys::Agent::new(agent_id).budgets());
        match self.invoke(invocation).await? {
            (now, Decoded::Budgets(buckets)) => Ok(Reply {
                now,
                result: Ok(buckets),
                replicas: 0,
            }),
            (_, other) => Err(unexpected("budgets", &other)),
        }
    }
}
