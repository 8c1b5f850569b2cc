/**
 * A gate's address as every client takes it, read in one place: `host:port` and
 * `http://host:port` (plaintext HTTP/2), `https://host:port` (TLS), `unix:<path>` (a gate's admin
 * socket on this machine), the forms the CLI (`oncegate call --server`) and the Python and Rust
 * clients take too. Anything else is refused with the forms it could have been, in one sentence.
 *
 * The environment names a gate's address twice, as for the CLI: `ONCEGATE_TARGET` the worker's (a
 * `GateClient` made without one), `ONCEGATE_ADMIN_TARGET` the operator's (a `Resolver` made without
 * one); their earlier names are still read, with a warning naming the new one.
 *
 * It owns the parsing only; `rpc.ts` opens the connection it describes.
 */

/** The forms an address may take, as every refusal names them. */
export const ADDRESS_FORMS =
  "host:port, http://host:port, https://host:port (TLS) or unix:<path> (a gate's admin socket)";

/** A gate's address, read. */
export type Address =
  /** `host:port` or `http://host:port` (plaintext), `https://host:port` (TLS): the URL to dial. */
  | { kind: "tcp"; baseUrl: string }
  /** `unix:<path>` (or `unix://<absolute path>`): a Unix socket, the gate's admin socket. */
  | { kind: "unix"; path: string };

const HOST_PORT = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$/;

/** `given` read as a gate's address; throws a `TypeError` naming {@link ADDRESS_FORMS} otherwise. */
export function parseAddress(given: string): Address {
  const text = given.trim();
  if (text.startsWith("unix:")) {
    const path = text.startsWith("unix://") ? text.slice("unix://".length) : text.slice("unix:".length);
    if (path !== "") return { kind: "unix", path };
  } else {
    const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(text);
    const rest = scheme ? text.slice(scheme[0].length) : text;
    const authority = rest.endsWith("/") ? rest.slice(0, -1) : rest;
    const port = HOST_PORT.exec(authority)?.[1];
    if (port !== undefined && Number(port) <= 65535) {
      const name = scheme?.[1]!.toLowerCase();
      if (name === undefined || name === "http") return { kind: "tcp", baseUrl: `http://${authority}` };
      if (name === "https") return { kind: "tcp", baseUrl: `https://${authority}` };
    }
  }
  throw new TypeError(`${JSON.stringify(given)} is not a gate address: give ${ADDRESS_FORMS}`);
}

/** The environment variable naming the worker's gate. */
export const TARGET_ENV = "ONCEGATE_TARGET";
/** The environment variable naming the operator's gate (often its admin socket). */
export const ADMIN_TARGET_ENV = "ONCEGATE_ADMIN_TARGET";
/** The address without any: a gate on this machine on its default port. */
export const DEFAULT_ADDRESS = "127.0.0.1:50051";

const OLD_NAMES: Record<string, readonly string[]> = {
  [TARGET_ENV]: ["ONCEGATE_SERVER", "ONCEGATE_GATE"],
  [ADMIN_TARGET_ENV]: ["ONCEGATE_SERVER"],
};

/**
 * The gate's address when none is given: `ONCEGATE_ADMIN_TARGET` (`admin`) or `ONCEGATE_TARGET`,
 * else an earlier name of it (with a one-line warning naming the new one), else
 * {@link DEFAULT_ADDRESS}.
 */
export function addressFromEnv(admin = false, env: NodeJS.ProcessEnv = process.env): string {
  const name = admin ? ADMIN_TARGET_ENV : TARGET_ENV;
  for (const variable of [name, ...OLD_NAMES[name]!]) {
    const value = env[variable]?.trim();
    if (value) {
      if (variable !== name) process.emitWarning(`${variable} is deprecated: set ${name} instead`, "DeprecationWarning");
      return value;
    }
  }
  return DEFAULT_ADDRESS;
}
