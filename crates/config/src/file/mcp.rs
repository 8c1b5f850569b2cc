//! The `[mcp]` table of the configuration file: how `oncegate mcp` treats each tool of its
//! upstream MCP server. Parsed and validated here, once; the gateway (`tools::mcp`) only reads
//! the resulting [`McpSettings`].
//!
//! ```toml
//! [mcp]
//! agent_id = "support-agent"              # the agent the gateway acts for (or --agent-id)
//!
//! [mcp.tools."create_ticket"]
//! action = "tickets.create"               # the action name at the gate (default: the tool name)
//! key_fields = ["/title", "/customer"]    # JSON Pointers into the arguments, as action policies
//! on_error = "complete"                   # an upstream `isError: true` result: record it (default)
//!
//! [mcp.tools."search"]
//! gate = false                            # pass through, whatever its annotations say
//! ```
//!
//! A gated tool named here gets an action policy of its own (its metrics label, so the DAR is
//! per tool); `key_fields` given here become that policy's key fields. Owns no behaviour.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::{error::FileError, policy::PolicyTable};

/// What an upstream tool result with `isError: true` means for the gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnToolError {
    /// The tool ran and reported a failure: the result is recorded as the receipt and replayed
    /// on a retry (the gateway cannot tell a failure without effect from a partial one).
    #[default]
    Complete,
    /// The tool's errors are definite failures without effect: the token is released and a
    /// retry runs the tool again.
    Release,
}

/// How the gateway treats one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRule {
    /// `Some(true)`: always gated; `Some(false)`: always passed through; `None`: by the tool's
    /// annotations (gated unless `readOnlyHint: true`).
    pub gate: Option<bool>,
    /// The action name at the gate.
    pub action: String,
    /// What an `isError: true` result means.
    pub on_error: OnToolError,
}

/// The `[mcp]` table, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpSettings {
    /// The agent the gateway acts for, unless `--agent-id` says otherwise.
    pub agent_id: Option<String>,
    /// The tools named in the file, by tool name.
    pub tools: BTreeMap<String, ToolRule>,
}

impl McpSettings {
    /// The rule of `tool`: the file's, or the default (by annotations, action = tool name).
    pub fn rule(&self, tool: &str) -> ToolRule {
        self.tools.get(tool).cloned().unwrap_or_else(|| ToolRule {
            gate: None,
            action: tool.to_owned(),
            on_error: OnToolError::default(),
        })
    }
}

/// `[mcp]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct McpTable {
    agent_id: Option<String>,
    #[serde(default)]
    tools: BTreeMap<String, ToolTable>,
}

/// `[mcp.tools."<name>"]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolTable {
    gate: Option<bool>,
    action: Option<String>,
    key_fields: Option<Vec<String>>,
    on_error: Option<OnToolError>,
}

impl McpTable {
    /// Validates the table and gives every gated tool it names an action policy in `actions`
    /// (carrying its `key_fields`), so the tool has its own metrics label.
    pub(super) fn resolve(
        self,
        actions: &mut HashMap<String, PolicyTable>,
    ) -> Result<McpSettings, FileError> {
        if let Some(agent) = &self.agent_id
            && agent.is_empty()
        {
            return Err(FileError::new("mcp.agent_id must not be empty"));
        }
        let mut tools = BTreeMap::new();
        for (name, table) in self.tools {
            let at = format!("mcp.tools.\"{name}\"");
            let action = table.action.unwrap_or_else(|| name.clone());
            if action.is_empty() || action.ends_with('*') {
                return Err(FileError::new(format!(
                    "{at}.action must be an action name, not empty or a pattern"
                )));
            }
            if table.gate == Some(false) && table.key_fields.is_some() {
                return Err(FileError::new(format!(
                    "{at}: key_fields on a tool with gate = false"
                )));
            }
            if table.gate != Some(false) {
                let policy = actions.entry(action.clone()).or_default();
                if let Some(fields) = table.key_fields {
                    if policy.key_fields.is_some() {
                        return Err(FileError::new(format!(
                            "{at}.key_fields: actions.\"{action}\" sets key_fields too; set them in one place"
                        )));
                    }
                    policy.key_fields = Some(fields);
                }
            }
            let rule = ToolRule {
                gate: table.gate,
                action,
                on_error: table.on_error.unwrap_or_default(),
            };
            tools.insert(name, rule);
        }
        Ok(McpSettings {
            agent_id: self.agent_id,
            tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ConfigFile;
    use oncegate_domain::fingerprint::KeyFields;

    #[test]
    fn a_gated_tool_gets_a_policy_with_its_key_fields() {
        let (file, mcp) = ConfigFile::parse_with_mcp(
            r#"
            [mcp]
            agent_id = "support"
            [mcp.tools."create_ticket"]
            action = "tickets.create"
            key_fields = ["/title"]
            on_error = "release"
            [mcp.tools."search"]
            gate = false
            "#,
        )
        .unwrap();
        let rule = mcp.rule("create_ticket");
        assert_eq!(rule.action, "tickets.create");
        assert_eq!(rule.on_error, super::OnToolError::Release);
        let policy = file.policies.for_action("tickets.create").unwrap();
        assert_eq!(policy.name.as_deref(), Some("tickets.create"));
        assert_eq!(
            policy.key_fields,
            KeyFields::Pointers(vec!["/title".into()])
        );
        assert_eq!(mcp.rule("search").gate, Some(false));
        assert!(file.policies.names().all(|n| n != "search"));
        assert_eq!(mcp.rule("other").action, "other");
        assert_eq!(mcp.agent_id.as_deref(), Some("support"));
    }

    #[test]
    fn bad_tables_say_what_is_wrong() {
        for (text, needle) in [
            (
                "[mcp.tools.\"t\"]\nkey_fields = [\"/a\"]\n[actions.\"t\"]\nkey_fields = [\"/b\"]",
                "one place",
            ),
            (
                "[mcp.tools.\"t\"]\ngate = false\nkey_fields = [\"/a\"]",
                "gate = false",
            ),
            ("[mcp.tools.\"t\"]\naction = \"x.*\"", "pattern"),
            (
                "[mcp.tools.\"t\"]\nkey_fields = [\"a\"]",
                "must start with '/'",
            ),
            ("[mcp.tools.\"t\"]\non_error = \"retry\"", "unknown variant"),
            ("[mcp]\nagent = \"x\"", "unknown field"),
        ] {
            let err = ConfigFile::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
