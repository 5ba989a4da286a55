//! API tokens, plain (no actix, no store): the admin token and the scoped tokens created with
//! `provisioner token create`, and who may do what with them.
//!
//! - The **admin token** is the one `serve` writes to `DATA_DIR/token` when it initialises the
//!   store (with PostgreSQL, its SHA-256 is kept in the database for the other replicas). Its
//!   id is [`ADMIN_ID`]; it cannot be revoked through the API.
//! - **Created tokens** (`POST /v1/tokens`) have an id (`tok-N`), a [`Scope`] (`admin` or
//!   `read-only`), a creation time and, once revoked, a revocation time. The token itself
//!   (32 random bytes, hex: [`new_secret`]) is answered once; the store keeps only its
//!   SHA-256 ([`sha256_hex`]). A plain SHA-256 (no salt, no slow hash) is right here: the
//!   secret has 256 bits of entropy, so there is no dictionary to try and nothing a slow hash
//!   would protect; it also makes the hash usable as the lookup key.
//! - Hashes are compared in constant time ([`hashes_equal`], the `subtle` crate). A created
//!   token is found by its hash (an index lookup); what that lookup's timing could reveal is
//!   a prefix of the hash of an unknown 256-bit secret, which does not help guess the secret.
//! - [`Scope::may`]: a read-only token may read (`GET`, `HEAD`), never change; an admin token
//!   may do everything.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The id of the admin token (the data directory's `token` file), in the audit log and in
/// answers. No created token has it (theirs are `tok-N`).
pub(crate) const ADMIN_ID: &str = "admin";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Everything, token management included.
    Admin,
    /// Reads only (`GET`): every change is refused with 403.
    ReadOnly,
}

impl Scope {
    /// `admin` or `read-only`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::ReadOnly => "read-only",
        }
    }

    /// Whether this scope may make a request with `method` (`GET`, `POST`, ...): `Err` names
    /// why not, in one sentence.
    pub fn may(self, method: &str) -> Result<(), String> {
        match self {
            Scope::Admin => Ok(()),
            Scope::ReadOnly if matches!(method, "GET" | "HEAD") => Ok(()),
            Scope::ReadOnly => Err(format!(
                "this API token is read-only: it may read (GET) but not change anything ({method} refused); \
                 use an admin token"
            )),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "admin" => Ok(Scope::Admin),
            "read-only" => Ok(Scope::ReadOnly),
            other => Err(format!("unknown token scope {other:?}: expected admin or read-only")),
        }
    }
}

/// A created token as the store keeps it: never the token, only its hash (and the hash is
/// never answered either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenRecord {
    /// `tok-N`.
    pub id: String,
    /// What it may do.
    pub scope: Scope,
    /// When it was created (RFC 3339, UTC).
    pub created: String,
    /// When it was revoked, if it was (RFC 3339, UTC).
    pub revoked: Option<String>,
    /// The one model it may use (`None`: every model; service-wide management needs that).
    pub model: Option<String>,
    /// That model's uuid when the token was made (schema 7 on SQLite, 10 on PostgreSQL): the
    /// token is valid for that model only, not for a later model of the same name. `None` for a
    /// token of every model, and for a scoped token made before the uuid was kept.
    pub model_uuid: Option<String>,
}

impl TokenRecord {
    /// A token just created: `model` is the name and uuid of the one model it may use.
    pub(crate) fn created(id: String, scope: Scope, created: &str, model: Option<(&str, &str)>) -> Self {
        Self {
            id,
            scope,
            created: created.to_owned(),
            revoked: None,
            model: model.map(|m| m.0.to_owned()),
            model_uuid: model.map(|m| m.1.to_owned()),
        }
    }
}

/// Whether a token scoped to `scoped` (`None`: every model) may use model `target`: `Err`
/// names why not, in one sentence.
pub(crate) fn may_use_model(scoped: Option<&str>, target: &str) -> Result<(), String> {
    match scoped {
        Some(mine) if mine != target => {
            Err(format!("this API token is scoped to model {mine:?}: it may not use model {target:?}"))
        }
        _ => Ok(()),
    }
}

/// The id of the `n`-th created token (`tok-1`, `tok-2`, ...).
pub(crate) fn token_id(n: u64) -> String {
    format!("tok-{n}")
}

/// SHA-256 of the token, lower-case hex.
pub fn sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two hashes are equal, compared in constant time (no early exit on the first
/// difference).
pub(crate) fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A new token: 32 random bytes (the operating system's generator, through `rand`'s thread
/// RNG, reseeded from it), hex.
pub(crate) fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_sha256_in_hex() {
        assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_ne!(sha256_hex("abc"), sha256_hex("abd"));
    }

    #[test]
    fn hashes_compare_whole() {
        assert!(hashes_equal("abc", "abc"));
        assert!(!hashes_equal("abc", "abd"));
        assert!(!hashes_equal("abc", "abcd"));
        assert!(!hashes_equal("", "a"));
    }

    #[test]
    fn secrets_are_32_random_bytes_in_hex() {
        let (a, b) = (new_secret(), new_secret());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn read_only_reads_and_admin_does_everything() {
        for m in ["GET", "HEAD"] {
            assert_eq!(Scope::ReadOnly.may(m), Ok(()));
        }
        for m in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let why = Scope::ReadOnly.may(m).unwrap_err();
            assert!(why.contains("read-only") && why.contains(m), "{why}");
            assert_eq!(Scope::Admin.may(m), Ok(()));
        }
    }

    #[test]
    fn a_model_scoped_token_uses_its_model_alone() {
        assert_eq!(may_use_model(None, "anything"), Ok(()));
        assert_eq!(may_use_model(Some("team-a"), "team-a"), Ok(()));
        let why = may_use_model(Some("team-a"), "default").unwrap_err();
        assert!(why.contains("\"team-a\"") && why.contains("\"default\""), "{why}");
    }

    #[test]
    fn scopes_spell_as_the_contract_says() {
        for s in [Scope::Admin, Scope::ReadOnly] {
            assert_eq!(s.as_str().parse::<Scope>(), Ok(s));
        }
        assert_eq!(Scope::ReadOnly.to_string(), "read-only");
        assert!("root".parse::<Scope>().unwrap_err().contains("\"root\""));
        assert_eq!(token_id(3), "tok-3");
    }
}
