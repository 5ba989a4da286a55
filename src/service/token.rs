//! The API token's hash, as replicas on PostgreSQL keep and compare it (only the replica that
//! initialised the database holds the token itself, in its data directory).

use sha2::{Digest, Sha256};

/// SHA-256 of the token, lower-case hex.
pub fn sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_sha256_in_hex() {
        assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_ne!(sha256_hex("abc"), sha256_hex("abd"));
    }
}
