/* Minimal UDP sender for comparing offlab-engine with the kernel's limit,
 * in the spirit of tools/testing/selftests/net/udpgso_bench_tx.c.
 * usage: ref_tx DEST_IPV4 PORT SIZE GSO_SEGMENTS SECONDS
 *   GSO_SEGMENTS 0: one datagram per send(); N: UDP_SEGMENT, N*SIZE bytes per send().
 * Prints one JSON line: datagrams, bytes, calls, errors, seconds (sender side). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s DEST PORT SIZE GSO_SEGMENTS SECONDS\n", argv[0]);
		return 2;
	}
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
	size_t len = (size_t)size * (segs > 0 ? segs : 1);
	char *buf = calloc(1, len);
	unsigned long long calls = 0, errors = 0, bytes = 0;
	double start = now(), end = start + secs, t = start;
	while (t < end) {
		/* Read the clock every 64 calls only: the loop is the measurement. */
		for (int i = 0; i < 64; i++) {
			ssize_t r = send(fd, buf, len, 0);
			calls++;
			if (r < 0)
				errors++;
			else
				bytes += r;
		}
		t = now();
	}
	unsigned long long dgrams = bytes / size;
	printf("{\"role\": \"ref_tx\", \"datagrams\": %llu, \"bytes\": %llu, \"calls\": %llu, "
	       "\"errors\": %llu, \"seconds\": %.6f}\n", dgrams, bytes, calls, errors, t - start);
	return 0;
}
