#include "catch_torch.h"

#include <cstdio>
#include <string>

#include "dstrain/core/error.h"
#include "dstrain/launch/topology.h"

using namespace dstrain;
using launch::Environment;
using launch::LaunchFlags;
using launch::Topology;

namespace {
Topology detect(const Environment& env, const LaunchFlags& flags = {}, int recipe_nproc = 0, int gpus = 0) {
  return launch::detect_topology(flags, env, recipe_nproc, 1, "127.0.0.1", 0, gpus);
}
}  // namespace

TEST_CASE("hostlists expand as Slurm writes them", "[launch]") {
  using V = std::vector<std::string>;
  CHECK(launch::expand_hostlist("node1") == V{"node1"});
  CHECK(launch::expand_hostlist("node[01-04,07]") == V{"node01", "node02", "node03", "node04", "node07"});
  CHECK(launch::expand_hostlist("a[8-11]") == V{"a8", "a9", "a10", "a11"});
  CHECK(launch::expand_hostlist("gpu[001-002]x,login,c[3]") == V{"gpu001x", "gpu002x", "login", "c3"});
  CHECK(launch::expand_hostlist("n[098-101]") == V{"n098", "n099", "n100", "n101"});
  CHECK(launch::expand_hostlist("rack1-n[1-2],rack2-n[1-2]") == V{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  // Several bracket groups in one name, the first outermost, as `scontrol show hostnames` lists them.
  CHECK(launch::expand_hostlist("rack[1-2]-node[01-02]") == V{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"});
  CHECK(launch::expand_hostlist("n[1-2][3-4],x") == V{"n13", "n14", "n23", "n24", "x"});
  for (const char* bad : {"node[1-", "node[a-b]", "node[4-2]", "n[[1]]", "a,,b", "n[]", "n[1-2]-[x]", "n[1-100000][1-100000]"}) {
    INFO(bad);
    CHECK_THROWS_AS(launch::expand_hostlist(bad), Error);
  }
}

TEST_CASE("without flags or a scheduler the recipe decides, else the GPUs, else 1", "[launch]") {
  Topology t = detect({}, {}, 3);
  CHECK(t.source == "recipe");
  CHECK(t.mode == Topology::Mode::kLauncher);
  CHECK(t.nproc_per_node == 3);
  CHECK(detect({}, {}, 0, 8).nproc_per_node == 8);
  CHECK(detect({}, {}, 0, 0).nproc_per_node == 1);
}

TEST_CASE("flags win over every environment", "[launch]") {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 1;
  f.master_addr = "10.0.0.1";
  f.master_port = 29511;
  f.nproc_per_node = 4;
  const Topology t = detect({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, f);
  CHECK(t.source == "flags");
  CHECK(t.mode == Topology::Mode::kLauncher);
  CHECK(t.world() == 8);
  CHECK(t.node_rank == 1);
  CHECK(t.master_addr == "10.0.0.1");
  CHECK(t.master_port == 29511);
  f.master_port = 0;
  CHECK_THROWS_WITH(detect({}, f), Catch::Contains("need a fixed rendezvous port"));
  f.master_port = 1;
  f.node_rank = 2;
  CHECK_THROWS_WITH(detect({}, f), Catch::Contains("node rank 2 is not below the number of nodes 2"));
}

TEST_CASE("a torchrun environment makes this process that rank", "[launch]") {
  const Topology t = detect({{"RANK", "5"},
                             {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "1"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "host0"},
                             {"MASTER_PORT", "29400"},
                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                             {"TORCHELASTIC_RUN_ID", "job7"}});
  CHECK(t.source == "torchrun");
  CHECK(t.mode == Topology::Mode::kRank);
  CHECK(t.rank == 5);
  CHECK(t.node_rank == 1);
  CHECK(t.nnodes == 2);
  CHECK(t.master_addr == "host0");
  CHECK(t.master_port == 29400);
  CHECK_FALSE(t.host_store);  // torchrun's agent hosts it
  CHECK(t.job_id == "job7");
  const Topology zero = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
  CHECK(zero.host_store);  // no agent store: rank 0 hosts
  CHECK(zero.master_port == 29500);
  CHECK_THROWS_WITH(detect({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}), Catch::Contains("inconsistent RANK/WORLD_SIZE"));
  CHECK_THROWS_WITH(detect({{"RANK", "x"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}), Catch::Contains("RANK='x' is not an integer"));
}

TEST_CASE("Slurm: one task per node runs a launcher per node", "[launch]") {
  // Recorded from `srun --nodes=4 --ntasks-per-node=1` (sbatch -N4).
  const Environment env = {{"SLURM_JOB_ID", "81234"},
                           {"SLURM_STEP_ID", "0"},
                           {"SLURM_PROCID", "2"},
                           {"SLURM_NTASKS", "4"},
                           {"SLURM_NNODES", "4"},
                           {"SLURM_NODEID", "2"},
                           {"SLURM_LOCALID", "0"},
                           {"SLURM_JOB_NODELIST", "gpu[07-09,12]"},
                           {"SLURM_TASKS_PER_NODE", "1(x4)"}};
  const Topology t = detect(env, {}, 8);
  CHECK(t.source == "slurm");
  CHECK(t.mode == Topology::Mode::kLauncher);
  CHECK(t.nnodes == 4);
  CHECK(t.node_rank == 2);
  CHECK(t.nproc_per_node == 8);
  CHECK(t.master_addr == "gpu07");
  CHECK(t.master_port == 10000 + (81234 * 131) % 50000);  // from the job and step ids, not a fixed 29500
  CHECK(t.job_id == "slurm-81234.0");
}

TEST_CASE("Slurm: one task per GPU makes each task a rank", "[launch]") {
  // Recorded from `srun --nodes=2 --ntasks-per-node=4`.
  const Environment env = {{"SLURM_JOB_ID", "555"},
                           {"SLURM_STEP_ID", "3"},
                           {"SLURM_PROCID", "6"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_NNODES", "2"},
                           {"SLURM_NODEID", "1"},
                           {"SLURM_LOCALID", "2"},
                           {"SLURM_JOB_NODELIST", "node[1-2]"},
                           {"SLURM_TASKS_PER_NODE", "4(x2)"},
                           {"MASTER_PORT", "12345"}};
  const Topology t = detect(env);
  CHECK(t.mode == Topology::Mode::kRank);
  CHECK(t.rank == 6);
  CHECK(t.world_size == 8);
  CHECK(t.local_rank == 2);
  CHECK(t.local_world_size == 4);
  CHECK(t.node_rank == 1);
  CHECK(t.master_addr == "node1");
  CHECK(t.master_port == 12345);
  CHECK_FALSE(t.host_store);
}

TEST_CASE("Slurm: the batch script of a multi-task job is refused at once, naming srun", "[launch]") {
  // sbatch --ntasks=2 with dstrain started in the script itself: no SLURM_STEP_ID.
  const Environment env = {
      {"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "1"}, {"SLURM_JOB_NODELIST", "node1"}};
  try {
    (void)detect(env);
    FAIL("the batch script was taken for rank 0");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains("batch script of a Slurm job with 2 tasks"));
    CHECK_THAT(e.hint(), Catch::Contains("srun dstrain train"));
  }
  // A one-task batch script is a plain launcher, as before.
  CHECK(detect({{"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_NNODES", "1"}}).mode ==
        Topology::Mode::kLauncher);
}

TEST_CASE("Slurm: ports and run ids differ per job and step; --master-port keeps Slurm's topology", "[launch]") {
  auto step = [](const std::string& job, const std::string& id) {
    return Environment{{"SLURM_JOB_ID", job}, {"SLURM_STEP_ID", id}, {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"}, {"SLURM_NNODES", "1"}, {"SLURM_JOB_NODELIST", "node1"}};
  };
  const Topology a = detect(step("900", "0")), b = detect(step("900", "1")), c = detect(step("901", "0"));
  CHECK(a.master_port != b.master_port);
  CHECK(a.master_port != c.master_port);
  for (const auto& t : {a, b, c}) CHECK((t.master_port >= 10000 && t.master_port < 60000));
  CHECK(a.job_id == "slurm-900.0");
  CHECK(b.job_id == "slurm-900.1");  // a second step in one allocation is another run
  LaunchFlags port;
  port.master_port = 23456;
  const Topology p = detect(step("900", "0"), port);
  CHECK(p.source == "slurm");
  CHECK(p.master_port == 23456);
}

TEST_CASE("Slurm: the step's node list and uneven tasks per node", "[launch]") {
  // A step on gpu-a[1-2] of a job on node01 and gpu-a[1-2]; 4 + 2 + 2 tasks over three nodes.
  const Environment env = {{"SLURM_JOB_ID", "42"},
                           {"SLURM_STEP_ID", "0"},
                           {"SLURM_PROCID", "6"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_NNODES", "3"},
                           {"SLURM_NODEID", "2"},
                           {"SLURM_LOCALID", "0"},
                           {"SLURM_JOB_NODELIST", "node01,gpu-a[1-2]"},
                           {"SLURM_STEP_NODELIST", "gpu-a[1-3]"},
                           {"SLURM_TASKS_PER_NODE", "4,2(x2)"}};
  const Topology t = detect(env);
  CHECK(t.master_addr == "gpu-a1");
  CHECK(t.mode == Topology::Mode::kRank);
  CHECK(t.nnodes == 3);
  CHECK(t.node_rank == 2);
  CHECK(t.local_world_size == 2);
  CHECK(t.nproc_per_node == 2);
  Environment bad = env;
  bad["SLURM_TASKS_PER_NODE"] = "4,2(x";
  CHECK_THROWS_WITH(detect(bad), Catch::Contains("SLURM_TASKS_PER_NODE='4,2(x' is not understood"));
}

TEST_CASE("OpenMPI and PMI processes are ranks", "[launch]") {
  const Topology o = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                             {"MASTER_ADDR", "10.1.1.1"}});
  CHECK(o.source == "openmpi");
  CHECK(o.mode == Topology::Mode::kRank);
  CHECK(o.world_size == 4);
  CHECK(o.nnodes == 2);
  CHECK(o.host_store);
  CHECK(o.master_addr == "10.1.1.1");
  const Topology p = detect({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  CHECK(p.source == "pmi");
  CHECK(p.rank == 3);
  CHECK(p.local_rank == 1);
  CHECK(p.node_rank == 1);
  CHECK_FALSE(p.host_store);
}

TEST_CASE("describe explains the decision", "[launch]") {
  const std::string text = detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).describe();
  CHECK_THAT(text, Catch::Contains("topology from openmpi: this process is rank 1 of 2"));
  CHECK_THAT(text, Catch::Contains("because: OMPI_COMM_WORLD_RANK/SIZE are set (mpirun)"));
}

// Run by test/slurm/slurm_test.sh with a test cluster's SLURM_CONF: scontrol is the reference.
TEST_CASE("hostlists expand as scontrol show hostnames does", "[.scontrol]") {
  // Every form Slurm accepts (a suffix after the last bracket, e.g. n[1-2]x, is "Invalid hostlist"
  // to scontrol; dstrain reads it anyway, and Slurm never produces it).
  const char* forms[] = {"node1",
                         "node[01-04,07]",
                         "a[8-11]",
                         "gpu[001-002],login,c[3]",
                         "n[098-101]",
                         "rack1-n[1-2],rack2-n[1-2]",
                         "rack[1-2]-node[01-02]",
                         "n[1-2][3-4],x",
                         "c[0-1,5,10-11]",
                         "host-[9-10]",
                         "a[1],b[2-3],c",
                         "x[00001-00003]",
                         "pre[01-02]mid[1-2]",
                         "gpu-a[1-2],gpu-b1"};
  for (const char* form : forms) {
    std::string reference;
    FILE* p = popen(("scontrol show hostnames '" + std::string(form) + "' 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) reference.append(buf, n);
    REQUIRE(pclose(p) == 0);
    std::string ours;
    for (const auto& host : launch::expand_hostlist(form)) ours += host + "\n";
    INFO(form);
    CHECK(ours == reference);
  }
}
