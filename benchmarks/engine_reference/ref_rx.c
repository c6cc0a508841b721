/* Minimal UDP receiver for comparing offlab-engine with the kernel's limit,
 * in the spirit of tools/testing/selftests/net/udpgso_bench_rx.c.
 * usage: ref_rx PORT GRO(0|1) SECONDS
 *   Binds 0.0.0.0:PORT with a 4 MiB SO_RCVBUFFORCE; with GRO=1 sets UDP_GRO and
 *   counts the datagrams in each buffer from the UDP_GRO cmsg's gso_size.
 *   Stops SECONDS after start or 1 s after the last datagram.
 * Prints one JSON line: datagrams, bytes (UDP payload), calls, window_s and
 * goodput_bps over the window from the first to the last datagram. */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s PORT GRO SECONDS\n", argv[0]);
		return 2;
	}
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	int gro = atoi(argv[2]), one = 1, rcvbuf = 4 << 20;
	double secs = atof(argv[3]);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct timeval tv = {.tv_sec = 0, .tv_usec = 20000};
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (gro && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one))) {
		perror("ref_rx: UDP_GRO");
		return 3;
	}
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		perror("ref_rx: bind");
		return 3;
	}
	fprintf(stderr, "ref_rx: ready\n");
	static char buf[65536];
	char ctrl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	unsigned long long dgrams = 0, bytes = 0, calls = 0;
	double start = now(), first = 0, last = 0, t;
	for (;;) {
		msg.msg_control = ctrl;
		msg.msg_controllen = sizeof(ctrl);
		ssize_t r = recvmsg(fd, &msg, 0);
		t = now();
		if (r >= 0) {
			int gso = 0;
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			if (cm && cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO)
				memcpy(&gso, CMSG_DATA(cm), sizeof(gso));
			calls++;
			bytes += r;
			dgrams += (gso > 0 && r > gso) ? (r + gso - 1) / gso : 1;
			if (!first)
				first = t;
			last = t;
		}
		if (t - start >= secs || (first && t - last >= 1.0))
			break;
	}
	double window = last - first;
	printf("{\"role\": \"ref_rx\", \"datagrams\": %llu, \"bytes\": %llu, \"calls\": %llu, "
	       "\"window_s\": %.6f, \"goodput_bps\": %.1f}\n",
	       dgrams, bytes, calls, window, window > 0 ? bytes * 8.0 / window : 0.0);
	return 0;
}
