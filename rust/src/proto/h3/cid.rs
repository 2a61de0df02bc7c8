//! The connection IDs this worker's QUIC endpoint issues (RFC 9000 §5.1):
//! 8 bytes: the worker's slot, the two bytes of [`MARKER`], five random.
//!
//! Under a Gunicorn master the slot is the index of the worker's UDP
//! socket in the port's `SO_REUSEPORT` group, and the group's BPF program
//! (`bpf`) sends every packet whose destination ID starts with it to that
//! socket. The marker tells the program an Initial packet carrying one of
//! ours (sent after the server's first Initial) from one carrying the
//! client's own first ID (hashed instead); a client's ID matches it by
//! chance once in 65536, and is then sent to the slot only if a worker
//! holds it. 40 random bits keep the IDs unpredictable and unlinkable
//! (RFC 9000 §5.1, §9.5).

use quinn::{ConnectionId, ConnectionIdGenerator};
use ring::rand::{SecureRandom, SystemRandom};

/// Length of the connection IDs issued, bytes.
pub(crate) const CID_LEN: usize = 8;

/// Bytes 1 and 2 of every ID issued (big-endian).
pub(crate) const MARKER: u16 = 0x5c4b;

/// Issues connection IDs that carry the worker's slot.
pub(crate) struct SlotCids {
    slot: u8,
    rng: SystemRandom,
}

impl SlotCids {
    /// IDs for the worker in `slot` (0 when the worker has no slot).
    pub(crate) fn new(slot: u8) -> Self {
        SlotCids {
            slot,
            rng: SystemRandom::new(),
        }
    }
}

impl ConnectionIdGenerator for SlotCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut id = [0u8; CID_LEN];
        id[0] = self.slot;
        id[1..3].copy_from_slice(&MARKER.to_be_bytes());
        if self.rng.fill(&mut id[3..]).is_err() {
            // The system's generator never fails on Linux after boot; a
            // predictable ID costs only its unlinkability (RFC 9000 §9.5).
            tracing::error!("no random bytes for a QUIC connection ID");
        }
        ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_slot_and_differ() {
        let mut g = SlotCids::new(7);
        let (a, b) = (g.generate_cid(), g.generate_cid());
        assert_eq!(a.len(), CID_LEN);
        assert_eq!((a[0], b[0]), (7, 7));
        assert_eq!(u16::from_be_bytes([a[1], a[2]]), MARKER);
        assert_ne!(a, b);
    }
}
