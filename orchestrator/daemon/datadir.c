/* The data directory: 0700 when created here, and its lock (see datadir.h). */
#include "orchestrator/daemon/datadir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/daemon/now.h"

struct datadir {
  int fd; /* DATA_DIR/LOCK, open (and locked) for the daemon's life */
  char lock_path[1100];
};

const char *datadir_lock_path(const datadir *d) { return d ? d->lock_path : ""; }

/* Copies the value of `key=` in the holder's line into out ("" if absent). */
static void datadir__field(const char *text, const char *key, char *out, size_t len) {
  out[0] = '\0';
  size_t kl = strlen(key);
  for (const char *p = text; (p = strstr(p, key)) != NULL; p += kl) {
    if ((p != text && p[-1] != ' ') || p[kl] != '=') continue;
    const char *v = p + kl + 1;
    size_t n = strcspn(v, " \n");
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), v);
    return;
  }
}

/* The lock is taken: say by whom, from what it wrote into the file. */
static void datadir__held(int fd, const char *dir, const char *lock_path, char *err,
                          size_t errlen) {
  char text[256] = "", pid[32], started[64];
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  datadir__field(text, "pid", pid, sizeof pid);
  datadir__field(text, "started", started, sizeof started);
  if (pid[0])
    snprintf(err, errlen,
             "data_dir \"%s\" is in use by another rlorch serve (pid %s, started %s): it holds "
             "the lock on %s; stop that daemon or give this one another data_dir",
             dir, pid, started[0] ? started : "at an unknown time", lock_path);
  else
    snprintf(err, errlen,
             "data_dir \"%s\" is in use by another process that holds the lock on %s (it has "
             "not written its pid yet); stop it or give this daemon another data_dir",
             dir, lock_path);
}

/* Writes this process into the lock file. Only the next daemon's message
 * reads it, so a failure costs that message's detail and nothing else: the
 * caller ignores the result. */
static int datadir__write_holder(int fd) {
  int64_t ms = now_unix_ms();
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  char iso[32] = "unknown";
  if (gmtime_r(&secs, &tm)) strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
  char line[160];
  int len = snprintf(line, sizeof line, "pid=%ld started_unix_ms=%lld started=%s\n",
                     (long)getpid(), (long long)ms, iso);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) return -1;
  return 0;
}

int datadir_open(const char *path, datadir **out, datadir_info *info, char *err,
                 size_t errlen) {
  *out = NULL;
  datadir_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (!path || !*path) return snprintf(err, errlen, "data_dir is empty"), DATADIR_EIO;
  /* 0700: the database holds every run's specs and records, and the rollout
   * logs hold prompts and completions; nobody but the daemon's user reads them. */
  if (mkdir(path, 0700) == 0) info->created = 1;
  else if (errno != EEXIST)
    return snprintf(err, errlen, "cannot create data_dir \"%s\": %s", path, strerror(errno)),
           DATADIR_EIO;
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return snprintf(err, errlen, "data_dir \"%s\" is not a directory", path), DATADIR_EIO;
  info->mode = st.st_mode & 07777;
  info->shared = !info->created && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0;
  datadir *d = calloc(1, sizeof *d);
  if (!d) return snprintf(err, errlen, "out of memory"), DATADIR_EIO;
  if ((size_t)snprintf(d->lock_path, sizeof d->lock_path, "%s/LOCK", path) >= sizeof d->lock_path) {
    free(d);
    return snprintf(err, errlen, "data_dir \"%s\" is too long", path), DATADIR_EIO;
  }
  d->fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (d->fd < 0) {
    snprintf(err, errlen, "cannot open the lock file %s: %s", d->lock_path, strerror(errno));
    free(d);
    return DATADIR_EIO;
  }
  if (flock(d->fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    int rc = DATADIR_EIO;
    if (e == EWOULDBLOCK) {
      datadir__held(d->fd, path, d->lock_path, err, errlen);
      rc = DATADIR_ELOCKED;
    } else {
      snprintf(err, errlen, "cannot lock %s: %s", d->lock_path, strerror(e));
    }
    close(d->fd);
    free(d);
    return rc;
  }
  (void)datadir__write_holder(d->fd);
  *out = d;
  return DATADIR_OK;
}

void datadir_close(datadir *d) {
  if (!d) return;
  close(d->fd); /* releases the lock */
  free(d);
}
