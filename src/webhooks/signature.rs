//! Standard Webhooks signing: secrets `whsec_<base64 key>` and `v1,<base64 HMAC-SHA256
//! of "{id}.{timestamp}.{body}">`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// The prefix of every signing secret.
const SECRET_PREFIX: &str = "whsec_";
/// Bytes of key in a new secret.
const KEY_BYTES: usize = 32;

/// A new random signing secret, `whsec_<base64 of 32 random bytes>`.
pub fn generate_secret() -> String {
    let mut key = [0_u8; KEY_BYTES];
    rand::rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The `webhook-signature` header value for one try of a delivery.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    // Secrets are only ever made by `generate_secret`, so they decode; an undecodable
    // one still signs (with its text as the key) rather than stopping the dispatcher.
    let key = STANDARD
        .decode(encoded)
        .unwrap_or_else(|_| encoded.as_bytes().to_vec());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes keys of any length");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn signs_the_specification_example() {
        let signature = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn new_secrets_carry_32_bytes_of_key() {
        let secret = generate_secret();
        let key = STANDARD
            .decode(secret.strip_prefix(SECRET_PREFIX).unwrap())
            .unwrap();
        assert_eq!(key.len(), KEY_BYTES);
        assert_ne!(secret, generate_secret());
    }
}
