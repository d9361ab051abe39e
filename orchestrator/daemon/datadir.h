/* The data directory of `rlorch serve`: made private when the daemon creates
 * it, and locked for the daemon's whole life, so that exactly one daemon owns
 * its database at a time.
 *
 * Two daemons on one directory would each take the other's active run for
 * one a crash left behind and drive it at the same time; the lock makes the
 * second one stop before it reads anything. The lock is flock(2) on
 * DATA_DIR/LOCK, held by an open descriptor: the kernel releases it when the
 * process ends in any way (kill -9 included), so a stale lock never needs
 * cleaning up. The file says who holds it ("pid=N started_unix_ms=T
 * started=ISO-8601"), for the message the next daemon prints; the lock, not
 * the text, decides. flock is local to one machine: a data_dir on a network
 * file system shared by two hosts is not protected. Loop thread only. */
#ifndef RLORCH_DAEMON_DATADIR_H
#define RLORCH_DAEMON_DATADIR_H

#include <stddef.h>
#include <sys/types.h>

enum {
  DATADIR_OK = 0,
  DATADIR_EIO = -1,     /* cannot create, open or lock (the message says which) */
  DATADIR_ELOCKED = -2, /* another process holds the lock */
};

typedef struct datadir datadir;

/* What datadir_open found. */
typedef struct datadir_info {
  int created;     /* the directory did not exist and was made 0700 */
  mode_t mode;     /* its permission bits */
  int shared;      /* an existing directory that group or others may enter */
} datadir_info;

/* Creates `path` (0700) if missing, then takes the lock. On DATADIR_ELOCKED
 * err names the directory, the lock file and the holder's pid and start time;
 * nothing in the directory was touched. `info` may be NULL. */
int datadir_open(const char *path, datadir **out, datadir_info *info, char *err, size_t errlen);
/* Releases the lock (NULL is fine). */
void datadir_close(datadir *d);
/* DATA_DIR/LOCK, for messages. */
const char *datadir_lock_path(const datadir *d);

#endif
