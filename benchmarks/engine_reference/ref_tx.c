/* Minimal UDP sender for comparing offlab-engine with the kernel's limit,
 * in the spirit of tools/testing/selftests/net/udpgso_bench_tx.c.
 * usage: ref_tx DEST_IPV4 PORT SIZE GSO_SEGMENTS SECONDS [zerocopy]
 *   GSO_SEGMENTS 0: one datagram per send(); N: UDP_SEGMENT, N*SIZE bytes per send().
 *   zerocopy: SO_ZEROCOPY and send(MSG_ZEROCOPY) from one buffer (never rewritten), completions
 *   read from the error queue in bulk (once 128 are outstanding, and when a send fails ENOBUFS).
 * Prints one JSON line: datagrams, bytes, calls, errors, seconds (sender side). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/errqueue.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads the zero-copy completions queued on the error queue; returns how many sends they cover. */
static unsigned long long completions(int fd, unsigned long long *copied)
{
	unsigned long long done = 0;
	char control[256];
	for (;;) {
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
}

int main(int argc, char **argv)
{
	if (argc != 6 && !(argc == 7 && !strcmp(argv[6], "zerocopy"))) {
		fprintf(stderr, "usage: %s DEST PORT SIZE GSO_SEGMENTS SECONDS [zerocopy]\n", argv[0]);
		return 2;
	}
	int zc = argc == 7;
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
	char *buf = calloc(1, len);
	unsigned long long calls = 0, errors = 0, bytes = 0;
	double start = now(), end = start + secs, t = start;
	while (t < end) {
		/* Read the clock every 64 calls only: the loop is the measurement. */
		for (int i = 0; i < 64; i++) {
			ssize_t r = send(fd, buf, len, zc ? MSG_ZEROCOPY : 0);
			calls++;
			if (r < 0) {
				errors++;
				if (zc && errno == ENOBUFS)
					zc_done += completions(fd, &zc_copied);
			} else {
				bytes += r;
				zc_sent += zc;
			}
			if (zc && zc_sent - zc_done >= 128)
				zc_done += completions(fd, &zc_copied);
		}
		t = now();
	}
	unsigned long long dgrams = bytes / size;
	double wait_end = now() + 2;
	while (zc && zc_done < zc_sent && now() < wait_end) {
		struct pollfd p = {.fd = fd};
		poll(&p, 1, 10);
		zc_done += completions(fd, &zc_copied);
	}
	printf("{\"role\": \"ref_tx\", \"datagrams\": %llu, \"bytes\": %llu, \"calls\": %llu, "
	       "\"errors\": %llu, \"seconds\": %.6f, \"zerocopy_sent\": %llu, \"zerocopy_completed\": %llu, "
	       "\"zerocopy_copied\": %llu}\n", dgrams, bytes, calls, errors, t - start, zc_sent, zc_done, zc_copied);
	return 0;
}
