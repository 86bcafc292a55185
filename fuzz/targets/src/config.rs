//! Target `config`: the TOML config files of the relay, the client and the authority, parsed
//! and checked as each role does at start (and the relay at SIGHUP), and a relay's settings
//! under the network parameters an authority config would publish.

use chive_node::fuzzing::{
    authority_config, client_config, relay_config, relay_config_with_params,
};

/// First byte (modulo 4): 0 relay, 1 client, 2 authority, 3 an authority config and a relay
/// config separated by a NUL byte (the relay checked against the authority's parameters); the
/// rest is the file's text (UTF-8). Property: no panic; a refusal is an error value (which
/// names the option: the roles print it and exit).
pub fn config(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match mode % 4 {
        0 => drop(relay_config(text)),
        1 => drop(client_config(text)),
        2 => drop(authority_config(text)),
        _ => {
            let (auth, relay) = text.split_once('\0').unwrap_or((text, ""));
            if let Ok(params) = authority_config(auth) {
                drop(relay_config_with_params(relay, &params));
            }
        }
    }
}
