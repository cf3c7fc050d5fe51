// Run once by the compose file's mongo-init service, from inside mongo1's network namespace:
// its connection to 127.0.0.1 is the localhost exception that may initiate the replica set and
// create the first user while access control (the keyfile) is already on. A second run
// authenticates as root and only brings the dockflow user's password up to date.
//
// Secrets come from files (compose secrets), never from the environment or this script:
//   /run/secrets/mongo_root_password      the root user's password
//   /run/secrets/dockflow_mongodb_url     the URL dockflow connects with; its user and password
//                                         are the dockflow user created here (in admin:
//                                         the URL ends with authSource=admin)
// DOCKFLOW_MONGODB_DB (environment) names the database the dockflow user may read and write.
const fs = require("fs");

function secret(name) {
  return fs.readFileSync("/run/secrets/" + name, "utf8").trim();
}

// mongodb://USER:PASSWORD@HOSTS/?OPTIONS (user and password percent-encoded).
function credentialsOf(url) {
  const found = /^mongodb:\/\/([^:@\/]+):([^@\/]+)@/.exec(url);
  if (!found) {
    throw new Error("dockflow_mongodb_url must be mongodb://USER:PASSWORD@HOSTS/?...");
  }
  return {user: decodeURIComponent(found[1]), password: decodeURIComponent(found[2])};
}

const rootPassword = secret("mongo_root_password");
const dockflow = credentialsOf(secret("dockflow_mongodb_url"));
const database = process.env.DOCKFLOW_MONGODB_DB || "dockflow";
const admin = db.getSiblingDB("admin");

function authenticatedAsRoot() {
  try {
    return admin.auth("root", rootPassword).ok === 1;
  } catch (e) {
    return false; // no user yet (first run) or a wrong password (the next step says which)
  }
}

let asRoot = authenticatedAsRoot();
if (!asRoot) {
  // First run: the localhost exception allows initiating and creating the first user.
  try {
    rs.status();
    print("replica set rs0 already initiated");
  } catch (e) {
    if (e.codeName === "Unauthorized") {
      throw new Error("mongo_root_password does not match the root user already created");
    }
    // mongo1 is preferred as primary: users are created through it (this script's node).
    rs.initiate({_id: "rs0", members: [
      {_id: 0, host: "mongo1:27017", priority: 2},
      {_id: 1, host: "mongo2:27017"},
      {_id: 2, host: "mongo3:27017"}]});
  }
  while (!db.hello().isWritablePrimary) { sleep(500); }
  admin.createUser({user: "root", pwd: rootPassword, roles: ["root"]});
  asRoot = authenticatedAsRoot();
  if (!asRoot) { throw new Error("the root user was created but does not authenticate"); }
  print("root user created");
}
while (!db.hello().isWritablePrimary) { sleep(500); }
print("replica set rs0 has a primary");

// dockflow's own user: read and write on its database only (no cluster or user administration).
const roles = [{role: "readWrite", db: database}];
if (admin.getUser(dockflow.user) === null) {
  admin.createUser({user: dockflow.user, pwd: dockflow.password, roles: roles});
  print("user " + dockflow.user + " created");
} else {
  admin.updateUser(dockflow.user, {pwd: dockflow.password, roles: roles});
  print("user " + dockflow.user + " brought up to date");
}
