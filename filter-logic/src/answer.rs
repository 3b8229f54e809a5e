//! A callout's answer that is not one: what an error says of it.

/// How much of a failed answer's body an error quotes.
const QUOTED_BYTES: usize = 512;

/// Why an answer with status `status` and `body` was refused: `reason` (why the body is no
/// answer) when the status was 200, else the status and the start of the body.
pub fn refused(status: &[u8], body: &[u8], reason: String) -> String {
    if status == b"200" {
        return reason;
    }
    format!(
        "sluice-server answered {}: {}",
        String::from_utf8_lossy(status),
        String::from_utf8_lossy(&body[..body.len().min(QUOTED_BYTES)]).trim()
    )
}
