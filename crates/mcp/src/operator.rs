//! What lets a person act on the in-process gate while the gateway runs, as `oncegate serve` lets
//! them act on its gate: the admin socket (`<data-dir>/admin.sock` by default), on which this
//! machine's user is the local operator (`oncegate admin approve`, `list-unresolved`, `resolve`,
//! `console-login`), and, with `--console-listen`, the operator console. Without them a call the
//! gate holds for approval could be approved only in the chat, and an unresolved action not at
//! all while the gateway runs (the store is the gateway's alone).
//!
//! Owns: binding and serving both for the in-process gate. Not the services (the gRPC layer's),
//! nor the pages (the console's), nor a gate server's (with `--gate`, that gate serves its own).

use oncegate_config::{defaults, exit};
use oncegate_gate::Gate;
use oncegate_grpc::{
    auth::{LoginCodes, Principals},
    server::AdminSocketServer,
};

use crate::McpArgs;

/// The admin socket and the console of the in-process gate, served while this lives.
pub struct LocalOperator {
    _socket: Option<AdminSocketServer>,
}

/// Serves the admin socket (unless `--no-admin-socket`) and the console (with
/// `--console-listen`) for `gate`; returns the gate to use (it keeps its recent decisions for
/// the console) and what serves them. `principals`: who may log into the console with an API
/// key (`[[principals]]` of the file); a code from the admin socket always works.
pub async fn start(
    args: &McpArgs,
    gate: Gate,
    principals: Principals,
) -> Result<(Gate, LocalOperator), (u8, String)> {
    let mut options = defaults::server();
    options.principals = principals.clone();
    let mut gate = gate;
    let console = match args.console_listen {
        Some(addr) if !addr.ip().is_loopback() => {
            return Err((
                exit::USAGE,
                format!(
                    "--console-listen {addr}: the gateway serves its console on a loopback \
                     address only (plain HTTP); for a console other machines reach, run `oncegate \
                     serve --console-listen … --insecure` behind a TLS proxy and give the gateway \
                     --gate"
                ),
            ));
        }
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                (
                    exit::UNAVAILABLE,
                    format!("cannot listen for the console on {addr}: {e}"),
                )
            })?;
            let logins = LoginCodes::default();
            options.console_logins = Some(logins.clone());
            gate = gate.with_recent_decisions(oncegate_console::RECENT_DECISIONS);
            Some((listener, logins))
        }
        None => None,
    };
    let socket = match admin_socket(args) {
        Some(path) => AdminSocketServer::start(&path, &gate, &options).map_err(|e| {
            (
                exit::UNAVAILABLE,
                format!("{e} (--admin-socket moves it, --no-admin-socket serves none)"),
            )
        })?,
        None => None,
    };
    if let Some((listener, logins)) = console {
        let bound = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(
            url = %format!("http://{bound}/"),
            "operator console of the in-process gate at http://{bound}/ (log in with a code from \
             `oncegate admin console-login` on this machine)"
        );
        let console = oncegate_console::Console::new(gate.clone(), principals, logins);
        tokio::spawn(oncegate_console::serve(
            listener,
            console,
            std::future::pending(),
        ));
    }
    Ok((gate, LocalOperator { _socket: socket }))
}

/// The admin socket to serve: `--admin-socket`, else `<data-dir>/admin.sock`; none with
/// `--no-admin-socket`.
fn admin_socket(args: &McpArgs) -> Option<std::path::PathBuf> {
    match (&args.admin_socket, args.no_admin_socket) {
        (_, true) => None,
        (Some(path), false) => Some(path.clone()),
        (None, false) => Some(args.data_dir.join(defaults::ADMIN_SOCKET)),
    }
}
