/* The data directory: created private, locked by one holder at a time, the
 * holder named to the next one. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orchestrator/daemon/datadir.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "%s/rlorch_datadir_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(datadir, .init = setup, .fini = teardown);

static datadir *open_ok(const char *path, datadir_info *info) {
  datadir *d = NULL;
  char err[1024] = "";
  cr_assert_eq(datadir_open(path, &d, info, err, sizeof err), DATADIR_OK, "%s", err);
  cr_assert_not_null(d);
  return d;
}

Test(datadir, created_0700_whatever_the_umask) {
  char sub[128];
  snprintf(sub, sizeof sub, "%s/data", dir);
  mode_t old = umask(0);
  datadir_info info;
  datadir *d = open_ok(sub, &info);
  umask(old);
  struct stat st;
  cr_assert_eq(stat(sub, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0700, "mode %o", st.st_mode & 07777);
  cr_assert(info.created);
  cr_assert_not(info.shared);
  cr_assert_eq(stat(datadir_lock_path(d), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0600, "the lock file is private too: %o", st.st_mode & 07777);
  datadir_close(d);
}

Test(datadir, an_existing_open_directory_is_reported_not_changed) {
  cr_assert_eq(chmod(dir, 0755), 0);
  datadir_info info;
  datadir *d = open_ok(dir, &info);
  cr_assert_not(info.created);
  cr_assert(info.shared);
  cr_assert_eq(info.mode, 0755);
  struct stat st;
  cr_assert_eq(stat(dir, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0755, "the operator's directory keeps its mode");
  datadir_close(d);
}

Test(datadir, second_holder_refused_naming_the_first) {
  datadir *first = open_ok(dir, NULL);
  FILE *f = fopen(datadir_lock_path(first), "r");
  cr_assert_not_null(f);
  char line[256] = "";
  cr_assert_not_null(fgets(line, sizeof line, f));
  fclose(f);
  char want[64];
  snprintf(want, sizeof want, "pid=%ld ", (long)getpid());
  cr_assert(strstr(line, want) && strstr(line, "started="), "the lock file names its holder: %s",
            line);

  /* Another open file description is another holder, even in this process. */
  datadir *second = NULL;
  char err[1024] = "";
  cr_assert_eq(datadir_open(dir, &second, NULL, err, sizeof err), DATADIR_ELOCKED);
  cr_assert_null(second);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  cr_assert(strstr(err, pid) && strstr(err, datadir_lock_path(first)) && strstr(err, "in use"),
            "the refusal names the holder and the lock file: %s", err);

  datadir_close(first);
  second = open_ok(dir, NULL);
  datadir_close(second);
}

Test(datadir, a_dead_holder_leaves_no_lock) {
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    datadir *d = NULL;
    char err[1024];
    if (datadir_open(dir, &d, NULL, err, sizeof err) != DATADIR_OK) _exit(1);
    _exit(0); /* ends without datadir_close, as a crash would */
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  datadir_close(open_ok(dir, NULL));
}

Test(datadir, bad_paths) {
  datadir *d = NULL;
  char err[1024] = "";
  cr_assert_eq(datadir_open("", &d, NULL, err, sizeof err), DATADIR_EIO);
  char file[128];
  snprintf(file, sizeof file, "%s/plain", dir);
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fclose(f);
  cr_assert_eq(datadir_open(file, &d, NULL, err, sizeof err), DATADIR_EIO);
  cr_assert(strstr(err, file) && strstr(err, "not a directory"), "%s", err);
  char below[160];
  snprintf(below, sizeof below, "%s/missing/sub", dir);
  cr_assert_eq(datadir_open(below, &d, NULL, err, sizeof err), DATADIR_EIO);
  cr_assert(strstr(err, below), "%s", err);
  cr_assert_null(d);
}
