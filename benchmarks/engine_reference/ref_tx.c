/* Minimal UDP sender for comparing offlab-engine with the kernel's limit,
 * in the spirit of tools/testing/selftests/net/udpgso_bench_tx.c.
 * usage: ref_tx DEST_IPV4 PORT SIZE GSO_SEGMENTS SECONDS [zerocopy | sendmmsg N | io_uring N | io_uring-zc N]
 *   GSO_SEGMENTS 0: one datagram per send(); N: UDP_SEGMENT, N*SIZE bytes per send().
 *   zerocopy: SO_ZEROCOPY and send(MSG_ZEROCOPY) from one buffer (never rewritten), completions
 *   read from the error queue in bulk (once 128 are outstanding, and when a send fails ENOBUFS).
 *   sendmmsg N: sendmmsg() of N messages a call.
 *   io_uring N / io_uring-zc N: N linked IORING_OP_SEND (SEND_ZC with IORING_SEND_ZC_REPORT_USAGE)
 *   SQEs per io_uring_enter(), which waits for their N completions, on a ring set up as the engine's
 *   (SINGLE_ISSUER | DEFER_TASKRUN, CQSIZE); raw syscalls, no liburing. Zero-copy notifications are
 *   counted (and their copied flag) as they come; buffers are never rewritten.
 * Buffers: as many as offlab-engine cycles through for the same path, so both touch the same memory:
 * one for send, N for sendmmsg / io_uring (message i from buffer i), and for the zero-copy paths the
 * engine's pool (engine/src/tx.rs zc_pool: twice the sends SO_SNDBUF admits, at least
 * two batches, at most 256, a power of two), used round robin.
 * -DREF_STAMP (the benchmark's "+stamp" rows): also do what offlab-engine must do for its loss and
 * latency accounting and buffer reuse, nothing else: read CLOCK_MONOTONIC once per call (the engine's
 * tx time), write into every segment's header (bytes 8..24) its big-endian sequence number and that
 * time, and with zerocopy, since it now rewrites buffers, read the completions once the next buffer
 * may still be held (every `buffers` sends, as the engine) rather than every 128.
 * Prints one JSON line: datagrams, bytes, calls, errors, seconds (sender side). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/errqueue.h>
#include <poll.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

#ifdef REF_STAMP
static unsigned long long stamp_seq;

/* The engine's tx time: CLOCK_MONOTONIC once per call (a send, a sendmmsg, an io_uring batch). */
static unsigned long long stamp_time(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return __builtin_bswap64(ts.tv_sec * 1000000000ULL + ts.tv_nsec);
}

/* The engine's header fields of one message's segments (engine/src/header.rs stamp_segments). */
static void stamp(char *msg, size_t len, int size, unsigned long long tx)
{
	for (size_t o = 0; o + 24 <= len; o += size) {
		unsigned long long *h = (unsigned long long *)(msg + o + 8);
		h[0] = __builtin_bswap64(stamp_seq++);
		h[1] = tx;
	}
}
#define STAMP_TIME(t) unsigned long long t = stamp_time()
#define STAMP(msg, len, size, t) stamp(msg, len, size, t)
#else
#define STAMP_TIME(t) (void)0
#define STAMP(msg, len, size, t) (void)0
#endif

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads the zero-copy completions queued on the error queue, until it is empty or they cover `want`
 * sends; returns how many sends they cover. */
static unsigned long long completions(int fd, unsigned long long *copied, unsigned long long want)
{
	unsigned long long done = 0;
	char control[256];
	while (done < want) {
		struct msghdr msg = {.msg_control = control, .msg_controllen = sizeof(control)};
		if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
			return done;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
			struct sock_extended_err *ee = (struct sock_extended_err *)CMSG_DATA(c);
			if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR &&
			    ee->ee_origin == SO_EE_ORIGIN_ZEROCOPY) {
				unsigned long long n = ee->ee_data - ee->ee_info + 1;
				done += n;
				if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
					*copied += n;
			}
		}
	}
	return done;
}


/* A ring as the engine's (engine/src/uring.rs): SQ of `entries`, CQ of `cq`, identity SQ array. */
struct ring {
	int fd;
	unsigned *sq_tail, sq_mask, *cq_head, *cq_tail, cq_mask, local_tail;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
};

static int ring_init(struct ring *r, unsigned entries, unsigned cq)
{
	struct io_uring_params p;
	unsigned flags[2] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, 0};
	for (int i = 0; i < 2; i++) {
		memset(&p, 0, sizeof(p));
		p.flags = flags[i] | IORING_SETUP_CQSIZE;
		p.cq_entries = cq;
		r->fd = syscall(__NR_io_uring_setup, entries, &p);
		if (r->fd >= 0 || errno != EINVAL)
			break;
	}
	if (r->fd < 0)
		return -1;
	size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	int single = p.features & IORING_FEAT_SINGLE_MMAP;
	if (single && cq_len > sq_len)
		sq_len = cq_len;
	char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
	char *cqm = single ? sq : mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
				       IORING_OFF_CQ_RING);
	r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
	if (sq == MAP_FAILED || cqm == MAP_FAILED || r->sqes == MAP_FAILED)
		return -1;
	r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
	r->sq_mask = *(unsigned *)(sq + p.sq_off.ring_mask);
	unsigned *array = (unsigned *)(sq + p.sq_off.array);
	for (unsigned i = 0; i < p.sq_entries; i++)
		array[i] = i;
	r->cq_head = (unsigned *)(cqm + p.cq_off.head);
	r->cq_tail = (unsigned *)(cqm + p.cq_off.tail);
	r->cq_mask = *(unsigned *)(cqm + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)(cqm + p.cq_off.cqes);
	r->local_tail = *r->sq_tail;
	return 0;
}

/* Pops one CQE into *c; 0 when the CQ is empty. */
static int ring_pop(struct ring *r, struct io_uring_cqe *c)
{
	unsigned head = *r->cq_head;
	if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE))
		return 0;
	*c = r->cqes[head & r->cq_mask];
	__atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
	return 1;
}

static unsigned long long zc_notifs, zc_notif_copied;

/* n linked sends of bufs first.. (len bytes each, modulo nbufs) in one io_uring_enter that waits for
 * their n completions; returns how many succeeded. */
static int ring_batch(struct ring *r, int fd, char *bufs, int first, int nbufs, size_t len, int n, int zc,
		      int size)
{
	(void)size;
	STAMP_TIME(tx);
	for (int i = 0; i < n; i++) {
		STAMP(bufs + (size_t)((first + i) % nbufs) * len, len, size, tx);
		struct io_uring_sqe *sqe = &r->sqes[r->local_tail++ & r->sq_mask];
		memset(sqe, 0, sizeof(*sqe));
		sqe->opcode = zc ? IORING_OP_SEND_ZC : IORING_OP_SEND;
		sqe->flags = i + 1 < n ? IOSQE_IO_LINK : 0;
		sqe->ioprio = zc ? IORING_SEND_ZC_REPORT_USAGE : 0;
		sqe->fd = fd;
		sqe->addr = (unsigned long)(bufs + (size_t)((first + i) % nbufs) * len);
		sqe->len = len;
		sqe->user_data = i;
	}
	__atomic_store_n(r->sq_tail, r->local_tail, __ATOMIC_RELEASE);
	int done = 0, sent = 0, to_submit = n;
	while (done < n) {
		int k = syscall(__NR_io_uring_enter, r->fd, to_submit, n - done, IORING_ENTER_GETEVENTS, NULL, 0);
		if (k > 0)
			to_submit -= k;
		else if (k < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
			perror("ref_tx: io_uring_enter");
			exit(3);
		}
		struct io_uring_cqe c;
		while (ring_pop(r, &c)) {
			if (c.flags & IORING_CQE_F_NOTIF) {
				zc_notifs++;
				zc_notif_copied += (c.res & IORING_NOTIF_USAGE_ZC_COPIED) != 0;
				continue;
			}
			done++;
			sent += c.res >= 0;
		}
	}
	return sent;
}

int main(int argc, char **argv)
{
	const char *mode = argc >= 7 ? argv[6] : "send";
	int batch = argc == 8 ? atoi(argv[7]) : 1;
	int mmsg = !strcmp(mode, "sendmmsg"), uring = !strncmp(mode, "io_uring", 8);
	int uring_zc = !strcmp(mode, "io_uring-zc");
	if (!(argc == 6 || (argc == 7 && !strcmp(mode, "zerocopy")) ||
	      (argc == 8 && (mmsg || uring) && batch >= 1 && batch <= 1024))) {
		fprintf(stderr, "usage: %s DEST PORT SIZE GSO_SEGMENTS SECONDS "
				"[zerocopy | sendmmsg N | io_uring N | io_uring-zc N]\n", argv[0]);
		return 2;
	}
	int zc = !strcmp(mode, "zerocopy");
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	int size = atoi(argv[3]), segs = atoi(argv[4]);
	double secs = atof(argv[5]);
	if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1 || size <= 0 || segs < 0) {
		fprintf(stderr, "ref_tx: bad arguments\n");
		return 2;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&dst, sizeof(dst))) {
		perror("ref_tx: socket/connect");
		return 3;
	}
	if (segs > 0 && setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &size, sizeof(size))) {
		perror("ref_tx: UDP_SEGMENT");
		return 3;
	}
	int one = 1;
	if (zc && setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one))) {
		perror("ref_tx: SO_ZEROCOPY");
		return 3;
	}
	size_t len = (size_t)size * (segs > 0 ? segs : 1);
	unsigned long long zc_sent = 0, zc_done = 0, zc_copied = 0;
	int nbufs = batch;
	if (zc || uring_zc) {
		int sndbuf = 0;
		socklen_t sl = sizeof(sndbuf);
		getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sl);
		int held = sndbuf / (int)len > 1 ? sndbuf / (int)len : 1;
		int lo = 2 * batch, hi = 256 > 2 * batch ? 256 : 2 * batch, want = 2 * held;
		want = want < lo ? lo : want > hi ? hi : want;
		for (nbufs = 1; nbufs < want; nbufs <<= 1)
			;
		if (zc && nbufs < 32)
			nbufs = 32; /* the engine's ZC_MIN_MSG */
	}
	/* Written through, as the engine writes its headers into every segment: calloc'ed pages never
	 * written would all map the kernel's one zero page, and copying from it stays in cache. */
	char *buf = malloc((size_t)nbufs * len);
	memset(buf, 0x5a, (size_t)nbufs * len);
	int next = 0; /* the buffer of the next send, round robin */
	unsigned long long calls = 0, errors = 0, bytes = 0;
	struct ring ring;
	unsigned cq = 2 * batch + (uring_zc ? 512 : 0);
	if (uring && ring_init(&ring, batch, cq < 8 ? 8 : cq)) {
		perror("ref_tx: io_uring_setup");
		return 3;
	}
	struct mmsghdr *msgs = calloc(batch, sizeof(*msgs));
	struct iovec *iov = calloc(batch, sizeof(*iov));
	for (int i = 0; i < batch; i++) {
		iov[i].iov_base = buf + (size_t)i * len;
		iov[i].iov_len = len;
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	double start = now(), end = start + secs, t = start;
	while (t < end && (mmsg || uring)) {
		for (int i = 0; i < 64; i++) {
			if (mmsg) {
				STAMP_TIME(tx);
				for (int m = 0; m < batch; m++)
					STAMP(buf + (size_t)m * len, len, size, tx);
			}
			int k = uring ? ring_batch(&ring, fd, buf, next, nbufs, len, batch, uring_zc, size)
				      : sendmmsg(fd, msgs, batch, 0);
			calls++;
			if (k <= 0)
				errors++;
			else
				bytes += (unsigned long long)k * len;
			zc_sent += uring_zc && k > 0 ? k : 0;
			next = (next + batch) % nbufs;
		}
		t = now();
	}
	while (t < end && !mmsg && !uring) {
		/* Read the clock every 64 calls only: the loop is the measurement. */
		for (int i = 0; i < 64; i++) {
			STAMP_TIME(tx);
			STAMP(buf + (size_t)next * len, len, size, tx);
			ssize_t r = send(fd, buf + (size_t)next * len, len, zc ? MSG_ZEROCOPY : 0);
			next = (next + 1) % nbufs;
			calls++;
			if (r < 0) {
				errors++;
				if (zc && errno == ENOBUFS)
					zc_done += completions(fd, &zc_copied, ~0ULL);
			} else {
				bytes += r;
				zc_sent += zc;
			}
#ifdef REF_STAMP
			/* Rewriting buffers, it must wait for their completions as the engine does: read them once the
			 * next buffer may still be held, and only until every send is accounted for. */
			if (zc && zc_sent - zc_done >= (unsigned long long)nbufs)
				zc_done += completions(fd, &zc_copied, zc_sent - zc_done);
#else
			if (zc && zc_sent - zc_done >= 128)
				zc_done += completions(fd, &zc_copied, ~0ULL);
#endif
		}
		t = now();
	}
	unsigned long long dgrams = bytes / size;
	double wait_end = now() + 2;
	while (uring_zc && zc_notifs < calls * batch && now() < wait_end) {
		struct io_uring_cqe c;
		syscall(__NR_io_uring_enter, ring.fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0);
		while (ring_pop(&ring, &c))
			if (c.flags & IORING_CQE_F_NOTIF) {
				zc_notifs++;
				zc_notif_copied += (c.res & IORING_NOTIF_USAGE_ZC_COPIED) != 0;
			}
	}
	if (uring_zc) {
		zc_done = zc_notifs;
		zc_copied = zc_notif_copied;
	}
	while (zc && zc_done < zc_sent && now() < wait_end) {
		struct pollfd p = {.fd = fd};
		poll(&p, 1, 10);
		zc_done += completions(fd, &zc_copied, ~0ULL);
	}
	printf("{\"role\": \"ref_tx\", \"datagrams\": %llu, \"bytes\": %llu, \"calls\": %llu, "
	       "\"errors\": %llu, \"seconds\": %.6f, \"zerocopy_sent\": %llu, \"zerocopy_completed\": %llu, "
	       "\"zerocopy_copied\": %llu}\n", dgrams, bytes, calls, errors, t - start, zc_sent, zc_done, zc_copied);
	return 0;
}
