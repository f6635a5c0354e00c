package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// setNice gives every thread of the process the niceness, and the
// endpoints run at 0 all the same.
func TestNice(t *testing.T) {
	needTopology(t)
	if err := setNice(7); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := setNice(0); err != nil {
			t.Error(err)
		}
	})
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if got := threadNice("/proc/self/task/" + task.Name() + "/stat"); got != "7" && got != "" {
			t.Errorf("thread %s: niceness %s, want 7", task.Name(), got)
		}
	}
	var topo topology
	defer topo.close()
	ns, err := topo.addNS("nice", "endpoint")
	if err != nil {
		t.Fatal(err)
	}
	argv := endpointArgs(ns, "cat", "/proc/self/stat")
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := statNice(string(out)); got != "0" {
		t.Errorf("an endpoint's niceness %s, want 0 (%q)", got, argv)
	}
}

// threadNice returns the niceness in the stat file at path, "" if the
// thread has ended.
func threadNice(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return statNice(string(b))
}

// statNice returns the niceness field of a /proc stat line (the 19th; the
// command name, which may hold spaces, ends at the last ')').
func statNice(stat string) string {
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(f) < 17 {
		return "?"
	}
	return f[16]
}
