//! The scripts as one Redis Functions library, loaded once per server instead of run whole on
//! every call.
//!
//! Why not `EVALSHA`: an `EVAL` script runs its whole text on every call, so the prelude every
//! transition shares (`prelude.lua`: some thirty helper functions) was made again, closure by
//! closure, on each call; Redis spent about 8 µs of every call doing that (`INFO
//! commandstats`, `usec_per_call` 11.7 with the prelude against 3.8 as a function: BENCHMARKS.md,
//! `scripts/bench_functions.py`). A library's top level runs once, when it
//! is loaded; each call runs only its own function. The functions share three
//! library-level variables the scripts were written against, set at the start of every call:
//! `KEYS`, `ARGV` (as in `EVAL`) and `NOW` (Redis `TIME` in ms, for the scripts that use the
//! prelude).
//!
//! The library's name and its functions' names carry a digest of its text, so gates of different
//! versions on one Redis (a rolling upgrade) each call their own. It is loaded when the store
//! connects and again whenever a call finds it missing (a restarted Redis without persistence, a
//! new Cluster master, `FUNCTION FLUSH`), as `ScriptInvocation` reloads on `NOSCRIPT`.

use std::sync::Arc;

use redis::{Cmd, RedisError, RedisResult, ToRedisArgs, Value, aio::ConnectionLike};
use sha2::{Digest, Sha256};

const PRELUDE: &str = include_str!("prelude.lua");
const OUTBOX_PRELUDE: &str = include_str!("outbox_prelude.lua");

/// What a function may do, as Redis checks it (`flags` of `redis.register_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Writes keys (refused while Redis is out of memory, like any write).
    Writes,
    /// Only reads (`no-writes`): runs while Redis is out of memory, like the read it is.
    Reads,
    /// Reads, and writes nothing but deletions (an index's stale members pruned): `allow-oom`, so
    /// that it runs while Redis is out of memory (a deletion only frees memory), as such a script
    /// did under `EVAL`.
    Prunes,
}

/// Which shared part a script's body is written against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// `prelude.lua`: the record's slots, load/save, chains, budgets, approvals; `NOW` set.
    Ledger,
    /// `outbox_prelude.lua`: the webhook outbox's entries; `NOW` set.
    Outbox,
    /// Nothing shared: the body reads its own clock if it needs one.
    Plain,
}

/// How a function's reply reaches the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// As Redis turns the body's Lua value into RESP.
    Resp,
    /// A table the body returns is sent as one string, `cmsgpack.pack` of it (an error reply
    /// and a non-table as they are), which `reply::unpacked` turns back into the value Redis
    /// would have made of it. redis-rs's RESP parser (`combine`) spends about 1,000 instructions
    /// on each item of a reply, a few hundred on one string; packing costs Redis about as much
    /// as writing the items as RESP (BENCHMARKS.md, "What was tried").
    Packed,
}

/// One script of the library: its name, its body (a `.lua` file written as an `EVAL` script:
/// `KEYS`, `ARGV`, a final `return`), what it is written against and how it replies.
pub(super) struct Source {
    pub name: &'static str,
    pub part: Part,
    pub access: Access,
    pub reply: Reply,
    pub body: &'static str,
}

/// The library's text and the names its functions are registered under.
pub(super) struct Library {
    name: String,
    /// The sources' names: the functions there are.
    functions: Vec<&'static str>,
    /// `og_<version>_`: the prefix of every function's name.
    prefix: String,
    code: Arc<str>,
}

impl Library {
    /// Builds the library from `sources`; the version is the digest of what they are made of.
    pub(super) fn new(sources: &[Source]) -> Self {
        let mut digest = Sha256::new();
        for part in [PRELUDE, OUTBOX_PRELUDE] {
            digest.update(part.as_bytes());
        }
        for s in sources {
            digest.update(s.name.as_bytes());
            digest.update([s.part as u8, s.access as u8, s.reply as u8]);
            digest.update(s.body.as_bytes());
        }
        let version: String = digest.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = format!("oncegate_{version}");
        let prefix = format!("og_{version}_");
        let code = assemble(&name, &prefix, sources);
        Self {
            name,
            functions: sources.iter().map(|s| s.name).collect(),
            prefix,
            code: code.into(),
        }
    }

    /// The function `name` of this library; panics when no source has that name (a mistake in
    /// the list of sources, found by every test that connects).
    pub(super) fn function(&self, name: &str) -> Function {
        assert!(
            self.functions.contains(&name),
            "no script named {name} in the library"
        );
        Function {
            name: format!("{}{name}", self.prefix),
            code: self.code.clone(),
        }
    }

    /// `FUNCTION LOAD REPLACE` of this library (REPLACE: another gate of the same version may
    /// have loaded it meanwhile; the text is the same).
    pub(super) fn load_cmd(&self) -> Cmd {
        load_cmd(&self.code)
    }

    /// The library's name in Redis (`FUNCTION LIST LIBRARYNAME`).
    pub(super) fn name(&self) -> &str {
        &self.name
    }
}

fn load_cmd(code: &str) -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(code);
    cmd
}

/// The library's text: the shared parts at most once each, every body wrapped in the function that
/// registers it. Each shared part sits in its own `do … end` block with the functions written
/// against it, so the two parts' names cannot meet.
fn assemble(name: &str, prefix: &str, sources: &[Source]) -> String {
    let mut code = format!(
        "#!lua name={name}\n\
         -- Generated by the gate from crates/store/src/redis/*.lua (library.rs).\n\
         local KEYS, ARGV, NOW\n\
         local function now_ms()\n\
         \x20 local t = redis.call('TIME')\n\
         \x20 return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n\
         end\n\
         local function packing(body)\n\
         \x20 return function(keys, args)\n\
         \x20   local reply = body(keys, args)\n\
         \x20   if type(reply) == 'table' and reply.err == nil and reply.ok == nil then\n\
         \x20     return cmsgpack.pack(reply)\n\
         \x20   end\n\
         \x20   return reply\n\
         \x20 end\n\
         end\n"
    );
    for (part, shared) in [
        (Part::Ledger, Some(PRELUDE)),
        (Part::Outbox, Some(OUTBOX_PRELUDE)),
        (Part::Plain, None),
    ] {
        code.push_str("do\n");
        if let Some(shared) = shared {
            code.push_str(shared);
            code.push('\n');
        }
        for s in sources.iter().filter(|s| s.part == part) {
            let flags = match s.access {
                Access::Writes => "",
                Access::Reads => "'no-writes'",
                Access::Prunes => "'allow-oom'",
            };
            let clock = if part == Part::Plain {
                ""
            } else {
                " NOW = now_ms()"
            };
            let (wrap, unwrap) = match s.reply {
                Reply::Resp => ("", ""),
                Reply::Packed => ("packing(", ")"),
            };
            code.push_str(&format!(
                "redis.register_function{{function_name = '{prefix}{}', flags = {{{flags}}},\n\
                 callback = {wrap}function(keys, args) KEYS, ARGV = keys, args{clock}\n{}\nend{unwrap}}}\n",
                s.name, s.body
            ));
        }
        code.push_str("end\n");
    }
    code
}

/// One function of the library, ready to be called.
pub(super) struct Function {
    /// Its name in Redis.
    name: String,
    /// The library's text, to load it again when it is missing.
    code: Arc<str>,
}

impl Function {
    /// A call of this function whose first key is `key`.
    pub(super) fn key<T: ToRedisArgs>(&self, key: T) -> Call<'_> {
        let mut call = Call {
            function: self,
            keys: Vec::new(),
            args: Vec::new(),
        };
        call.key(key);
        call
    }
}

/// A call being built: keys first, then arguments (`FCALL name numkeys key… arg…`).
pub(super) struct Call<'f> {
    function: &'f Function,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    /// Adds a key (`KEYS[n]`).
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.function.name).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        cmd
    }

    /// Runs the call on `conn`; when Redis does not know the function (the library is not
    /// loaded there), loads the library on that node and runs the call once more.
    ///
    /// The load goes in a pipeline with an `EXISTS` of the call's first key: redis-rs routes a
    /// Cluster pipeline by its first keyed command, so the library is loaded on the node that
    /// lacked it, whatever the other masters' state (a bare `FUNCTION LOAD` goes to every master
    /// and fails while any of them is down).
    pub(super) async fn invoke_async<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> RedisResult<Value> {
        let cmd = self.cmd();
        match cmd.query_async::<Value>(conn).await {
            Err(e) if is_missing(&e) => {
                tracing::info!(
                    function = %self.function.name,
                    "the oncegate functions are not loaded on this Redis node; loading them"
                );
                let mut load = redis::pipe();
                load.add_command(load_cmd(&self.function.code));
                if let Some(first) = self.keys.first() {
                    load.cmd("EXISTS").arg(first.as_slice());
                }
                // Each reply's error as Redis said it (its code, `OOM` say, decides whether a
                // retry cures it), not wrapped as a pipeline's.
                let replies: Vec<Value> = load.ignore_errors().query_async(conn).await?;
                for reply in replies {
                    reply.extract_error()?;
                }
                cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Whether Redis answered that it has no function of that name.
fn is_missing(e: &RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// Whether `cmd` calls a function (what `WAIT` follows in a lane).
pub(super) fn is_function_call(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"FCALL")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<Source> {
        vec![
            Source {
                name: "a",
                part: Part::Ledger,
                access: Access::Writes,
                reply: Reply::Packed,
                body: "return { NOW, KEYS[1], ARGV[1] }",
            },
            Source {
                name: "b",
                part: Part::Plain,
                access: Access::Reads,
                reply: Reply::Resp,
                body: "return 1",
            },
        ]
    }

    #[test]
    fn names_carry_the_version_and_change_with_the_text() {
        let library = Library::new(&sources());
        let version = library.name().strip_prefix("oncegate_").unwrap();
        assert_eq!(version.len(), 16);
        assert_eq!(library.function("a").name, format!("og_{version}_a"));
        let mut changed = sources();
        changed[1].body = "return 2";
        assert_ne!(Library::new(&changed).name(), library.name());
        let mut repacked = sources();
        repacked[1].reply = Reply::Packed;
        assert_ne!(
            Library::new(&repacked).name(),
            library.name(),
            "a gate reading packed replies never calls a function that sends RESP"
        );
        assert_eq!(Library::new(&sources()).name(), library.name(), "stable");
    }

    #[test]
    fn each_body_is_registered_once_with_its_flags_and_clock() {
        let library = Library::new(&sources());
        let code = &library.code;
        assert!(code.starts_with(&format!("#!lua name={}\n", library.name())));
        assert_eq!(code.matches("redis.register_function").count(), 2);
        assert!(code.contains("flags = {'no-writes'}"));
        assert_eq!(
            code.matches("NOW = now_ms()").count(),
            1,
            "only a ledger body"
        );
        assert_eq!(
            code.matches("callback = packing(function").count(),
            1,
            "only the packed body"
        );
        assert_eq!(
            code.matches("local STATE = 1").count(),
            1,
            "the prelude once"
        );
    }

    #[test]
    #[should_panic(expected = "no script named c")]
    fn a_function_not_in_the_sources_is_a_mistake() {
        Library::new(&sources()).function("c");
    }

    #[test]
    fn a_call_is_fcall_with_its_keys_counted() {
        let library = Library::new(&sources());
        let function = library.function("a");
        let mut call = function.key("k1");
        call.key("k2").arg("x").arg(7);
        let cmd = call.cmd();
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(s) => s.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let expected: Vec<&[u8]> = vec![
            b"FCALL",
            function.name.as_bytes(),
            b"2",
            b"k1",
            b"k2",
            b"x",
            b"7",
        ];
        assert_eq!(args, expected);
        assert!(is_function_call(&cmd));
        assert!(!is_function_call(&library.load_cmd()));
    }

    #[test]
    fn a_missing_function_is_recognised() {
        let e = redis::parse_redis_value(b"-ERR Function not found\r\n")
            .and_then(Value::extract_error)
            .expect_err("an error reply");
        assert!(is_missing(&e));
        let other = redis::parse_redis_value(b"-ERR user_function:1: boom\r\n")
            .and_then(Value::extract_error)
            .expect_err("an error reply");
        assert!(!is_missing(&other));
    }
}
