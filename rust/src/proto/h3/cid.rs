//! The connection IDs this worker's QUIC endpoint issues (RFC 9000 §5.1):
//! 8 bytes, the first the worker's slot, the other seven random.
//!
//! With one UDP socket per worker (`SO_REUSEPORT`), the kernel hashes each
//! packet by address; a connection whose client changes address, or whose
//! socket group changes (a worker restarts), can reach another worker. A
//! reuseport BPF program can steer a packet by its destination connection
//! ID instead: the slot in the first byte names the socket. That program
//! is not installed yet; the layout is fixed so that it can be.

use quinn::{ConnectionId, ConnectionIdGenerator};
use ring::rand::{SecureRandom, SystemRandom};

/// Length of the connection IDs issued, bytes.
pub(crate) const CID_LEN: usize = 8;

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
        if self.rng.fill(&mut id[1..]).is_err() {
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
        assert_ne!(a, b);
    }
}
