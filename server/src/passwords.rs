//! Operator passwords, hashed with argon2id (PHC string format, salt and parameters included),
//! so the store only ever sees the hash.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

/// Passwords shorter than this are refused when an operator is created.
pub const MIN_PASSWORD_LEN: usize = 8;

/// A password could not be hashed (or was refused).
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("the password must be at least {MIN_PASSWORD_LEN} characters")]
    TooShort,
    #[error("hashing the password failed: {0}")]
    Hash(String),
}

/// Hashes a password with argon2id and a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, PasswordError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(PasswordError::TooShort);
    }
    let mut salt_bytes = [0u8; 16];
    getrandom::fill(&mut salt_bytes).map_err(|e| PasswordError::Hash(format!("no randomness for the salt: {e}")))?;
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| PasswordError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// Whether `password` matches a hash made by [`hash_password`]. A malformed hash never matches.
pub fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mismatch() {
        let hash = hash_password("correct horse").expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("correct horsf", &hash));
        assert!(!verify_password("correct horse", "not a hash"));
        // Salted: the same password hashes differently each time.
        assert_ne!(hash, hash_password("correct horse").expect("hash"));
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(matches!(hash_password("short"), Err(PasswordError::TooShort)));
    }
}
