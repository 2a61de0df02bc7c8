//! The classic BPF program that steers each QUIC packet to the socket of
//! the worker that owns its connection (`SO_ATTACH_REUSEPORT_CBPF`; no
//! privilege needed, Linux ≥ 4.5).
//!
//! The kernel runs it on each datagram for the port's `SO_REUSEPORT` group
//! with the UDP payload at offset 0; the value returned is the index of the
//! socket in the group (its bind order, see `steer`), and a value ≥ the
//! group's size lets the kernel pick by address hash. RFC 9000 §17:
//!
//! * short header (first bit 0): the destination connection ID starts at
//!   byte 1, and it is one of ours: its first byte is the owner's slot;
//! * long header Handshake: byte 5 is the DCID length, the DCID (ours,
//!   chosen by the server's first Initial) starts at byte 6;
//! * Initial and 0-RTT: the DCID is the client's own until the server's
//!   first Initial arrives, ours afterwards. One of ours (our length, our
//!   marker after the slot, a slot some worker holds) goes to its slot;
//!   any other is hashed (its first four bytes modulo the number of active
//!   workers) onto an active worker, so that every Initial of one
//!   connection reaches the same worker.

/// A classic BPF instruction (`struct sock_filter`).
pub(crate) type Insn = libc::sock_filter;

/// Returned for "no choice": the kernel's address hash decides.
pub(crate) const KERNEL_HASH: u32 = u32::MAX;

// Opcodes (linux/filter.h, linux/bpf_common.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_LEN: u16 = 0x80;
const ALU_AND_K: u16 = 0x54;
const ALU_MOD_K: u16 = 0x94;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGE_K: u16 = 0x35;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// The length of the connection IDs the server issues (see `cid`).
const OUR_CID_LEN: u32 = super::cid::CID_LEN as u32;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// What the program knows of the group: which slots a live worker holds
/// (`held`), and which of them take new connections (`active`). Slots are
/// socket indices, each < 255.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slots {
    pub(crate) held: Vec<u8>,
    pub(crate) active: Vec<u8>,
}

/// The program for `slots` (at most 2 × 255 + 25 instructions, well under
/// the kernel's 4096). New connections go to the active slots; with none
/// active, to the held ones (a draining worker drops them for a while,
/// see `steer::hold_new`, so that the client's retransmission reaches a
/// successor once one serves); with none held, to the kernel's hash.
pub(crate) fn program(slots: &Slots) -> Vec<Insn> {
    let mut p = vec![
        op(LD_W_LEN, 0, 0, 0),
        // Shorter than a long header's first DCID bytes: not QUIC we serve.
        op(JMP_JGE_K, 1, 0, 10),
        op(RET_K, 0, 0, KERNEL_HASH),
        op(LD_B_ABS, 0, 0, 0),
        op(JMP_JSET_K, 2, 0, 0x80),
        // Short header: the slot is the DCID's first byte.
        op(LD_B_ABS, 0, 0, 1),
        op(RET_A, 0, 0, 0),
        op(ALU_AND_K, 0, 0, 0x30),
        // Handshake (2) and Retry (3, never from a client): our DCID.
        op(JMP_JEQ_K, 1, 0, 0x20),
        op(JMP_JEQ_K, 0, 2, 0x30),
        op(LD_B_ABS, 0, 0, 6),
        op(RET_A, 0, 0, 0),
        // Initial or 0-RTT: ours if our length and marker, else hashed.
        op(LD_B_ABS, 0, 0, 5),
        op(JMP_JEQ_K, 1, 0, OUR_CID_LEN),
    ];
    // The jumps to the hash below are `ja` (32-bit offsets), patched once
    // its position is known: the held-slot chain can be 255 long.
    let mut to_hash = vec![p.len()];
    p.push(op(JMP_JA, 0, 0, 0));
    p.push(op(LD_H_ABS, 0, 0, 7));
    p.push(op(JMP_JEQ_K, 1, 0, u32::from(super::cid::MARKER)));
    to_hash.push(p.len());
    p.push(op(JMP_JA, 0, 0, 0));
    p.push(op(LD_B_ABS, 0, 0, 6));
    let n = slots.held.len();
    for (i, &s) in slots.held.iter().enumerate() {
        // To the `ret a` after this chain and its `ja`.
        p.push(op(JMP_JEQ_K, (n - i) as u8, 0, u32::from(s)));
    }
    to_hash.push(p.len());
    p.push(op(JMP_JA, 0, 0, 0));
    p.push(op(RET_A, 0, 0, 0));
    let hash = p.len();
    for j in to_hash {
        p[j].k = (hash - j - 1) as u32;
    }
    let targets = if slots.active.is_empty() {
        &slots.held
    } else {
        &slots.active
    };
    let Some(&first) = targets.first() else {
        p.push(op(RET_K, 0, 0, KERNEL_HASH));
        return p;
    };
    p.push(op(LD_W_ABS, 0, 0, 6));
    p.push(op(ALU_MOD_K, 0, 0, targets.len() as u32));
    for (i, &s) in targets.iter().enumerate() {
        p.push(op(JMP_JEQ_K, 0, 1, i as u32));
        p.push(op(RET_K, 0, 0, u32::from(s)));
    }
    p.push(op(RET_K, 0, 0, u32::from(first)));
    p
}

/// Attaches `prog` to the reuseport group of the bound socket `fd` (it
/// replaces the group's program, for every socket in it).
///
/// Errors: the kernel's (`EINVAL` for a program it rejects, `ENOPROTOOPT`
/// before Linux 4.5, `EPERM` under a seccomp policy).
pub(crate) fn attach(fd: std::os::fd::BorrowedFd<'_>, prog: &[Insn]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel
    // copies the program and does not write through the pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs `prog` on `pkt` as the kernel would (the opcodes above only); for
/// the tests.
#[cfg(test)]
pub(crate) fn run(prog: &[Insn], pkt: &[u8]) -> u32 {
    let load = |k: u32, n: usize| -> Option<u32> {
        let b = pkt.get(k as usize..k as usize + n)?;
        Some(b.iter().fold(0u32, |a, &x| (a << 8) | u32::from(x)))
    };
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let i = prog[pc];
        pc += 1;
        let jump = |cond: bool| if cond { i.jt } else { i.jf } as usize;
        match i.code {
            LD_W_ABS | LD_H_ABS | LD_B_ABS => {
                let n = [4, 2, 1][usize::from((i.code - LD_W_ABS) / 8)];
                match load(i.k, n) {
                    Some(v) => a = v,
                    None => return 0,
                }
            }
            LD_W_LEN => a = pkt.len() as u32,
            ALU_AND_K => a &= i.k,
            ALU_MOD_K => a %= i.k,
            JMP_JA => pc += i.k as usize,
            JMP_JEQ_K => pc += jump(a == i.k),
            JMP_JGE_K => pc += jump(a >= i.k),
            JMP_JSET_K => pc += jump(a & i.k != 0),
            RET_K => return i.k,
            RET_A => return a,
            c => panic!("opcode {c:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(kind: u8, dcid: &[u8]) -> Vec<u8> {
        let mut p = vec![0xc0 | (kind << 4), 0, 0, 0, 1, dcid.len() as u8];
        p.extend_from_slice(dcid);
        p.extend_from_slice(&[0; 1200]);
        p
    }

    fn ours(slot: u8) -> Vec<u8> {
        let m = super::super::cid::MARKER.to_be_bytes();
        vec![slot, m[0], m[1], 9, 9, 9, 9, 9]
    }

    fn slots(held: &[u8], active: &[u8]) -> Slots {
        Slots {
            held: held.to_vec(),
            active: active.to_vec(),
        }
    }

    #[test]
    fn short_and_handshake_packets_go_to_the_slot() {
        let p = program(&slots(&[1, 3], &[3]));
        let mut short = vec![0x40];
        short.extend(ours(1));
        short.extend([0; 40]);
        assert_eq!(run(&p, &short), 1);
        assert_eq!(run(&p, &long(2, &ours(3))), 3);
        // An Initial with our ID, sent after the server's first Initial.
        assert_eq!(run(&p, &long(0, &ours(1))), 1);
        assert_eq!(run(&p, &long(1, &ours(1))), 1);
        assert_eq!(run(&p, &[0x40, 1]), KERNEL_HASH);
    }

    #[test]
    fn client_chosen_ids_are_hashed_onto_active_slots_only() {
        let p = program(&slots(&[0, 2, 5, 7], &[2, 7]));
        let mut seen = std::collections::BTreeSet::new();
        for n in 0u32..200 {
            let mut dcid = n.wrapping_mul(2654435761).to_be_bytes().to_vec();
            dcid.extend([n as u8; 4]);
            let to = run(&p, &long(0, &dcid));
            assert_eq!(to, run(&p, &long(0, &dcid)));
            seen.insert(to);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 7]);
        // Our marker on a slot nobody holds: hashed like a client's ID.
        let to = run(&p, &long(0, &ours(4)));
        assert!(to == 2 || to == 7, "{to}");
        // Nobody active: the held ones; nobody at all: the kernel.
        assert_eq!(run(&program(&slots(&[5], &[])), &long(0, &[1; 8])), 5);
        assert_eq!(
            run(&program(&Slots::default()), &long(0, &[1; 8])),
            KERNEL_HASH
        );
    }

    #[test]
    fn a_full_group_fits_the_jump_offsets() {
        let all: Vec<u8> = (0..255).collect();
        let p = program(&slots(&all, &all));
        assert!(p.len() < 4096);
        assert_eq!(run(&p, &long(2, &ours(254))), 254);
        assert_eq!(run(&p, &long(0, &ours(254))), 254);
        assert_eq!(run(&p, &long(0, &ours(0))), 0);
    }
}
